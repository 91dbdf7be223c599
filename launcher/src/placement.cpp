#include "placement.hpp"

#include <algorithm>

#include <hwloc.h>
#include <hwloc/glibc-sched.h>

#include <string>

#include <fmt/format.h>

#include "topology.hpp"

namespace nodal::launcher {
Placement place_ranks(int nprocs, BindTo bind_to, HostShare share) {
  Placement placement;
  placement.cpusets.assign(nprocs, std::nullopt);
  const int host_ranks = std::max(share.ranks, nprocs);
  // No binding wanted, or more ranks than CPUs (so more than cores): no topology needed.
  cpu_set_t allowed;
  int cpus = ::sched_getaffinity(0, sizeof allowed, &allowed) == 0 ? CPU_COUNT(&allowed) : 0;
  if (bind_to == BindTo::none || (bind_to == BindTo::automatic && cpus > 0 && host_ranks > cpus)) {
    placement.bind_to = BindTo::none;
    placement.cores = 0;
    placement.crowded = cpus > 0 && host_ranks > cpus;
    return placement;
  }
  const hwloc_topology_t topology = node_topology();
  placement.cores = hwloc_get_nbobjs_by_type(topology, HWLOC_OBJ_CORE);
  if (placement.cores <= 0) placement.cores = hwloc_get_nbobjs_by_type(topology, HWLOC_OBJ_PU);
  placement.crowded = placement.cores > 0 && host_ranks > placement.cores;
  placement.bind_to = bind_to;
  if (bind_to == BindTo::automatic) placement.bind_to = host_ranks <= placement.cores ? BindTo::core : BindTo::none;
  if (placement.bind_to == BindTo::none) return placement;

  hwloc_obj_type_t type = placement.bind_to == BindTo::core ? HWLOC_OBJ_CORE : HWLOC_OBJ_NUMANODE;
  int count = hwloc_get_nbobjs_by_type(topology, type);
  if (count <= 0) return placement;  // e.g. no NUMA information: leave ranks unbound
  for (int rank = 0; rank < nprocs; ++rank) {
    hwloc_obj_t obj = hwloc_get_obj_by_type(topology, type, static_cast<unsigned>((share.first + rank) % count));
    cpu_set_t set;
    if (obj && hwloc_cpuset_to_glibc_sched_affinity(topology, obj->cpuset, &set, sizeof set) == 0) {
      placement.cpusets[rank] = set;
    }
  }
  return placement;
}

std::string describe_cpuset(const cpu_set_t& set) {
  std::string text;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    int last = cpu;
    while (last + 1 < CPU_SETSIZE && CPU_ISSET(last + 1, &set)) ++last;
    text += text.empty() ? "" : ",";
    text += last == cpu ? fmt::format("{}", cpu) : fmt::format("{}-{}", cpu, last);
    cpu = last;
  }
  return text;
}

}  // namespace nodal::launcher
