#include "placement.hpp"

#include <hwloc.h>
#include <hwloc/glibc-sched.h>

#include <memory>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace nodal::launcher {
namespace {

using Topology = std::unique_ptr<hwloc_topology, decltype(&hwloc_topology_destroy)>;

Topology load_topology() {
  hwloc_topology_t raw = nullptr;
  if (hwloc_topology_init(&raw) != 0) throw std::runtime_error("hwloc_topology_init failed");
  Topology topology(raw, &hwloc_topology_destroy);
  // PCI and other I/O objects cost most of the load time and tell nothing about CPU placement.
  hwloc_topology_set_io_types_filter(raw, HWLOC_TYPE_FILTER_KEEP_NONE);
  if (hwloc_topology_load(raw) != 0) throw std::runtime_error("hwloc_topology_load failed");
  return topology;
}

}  // namespace

Placement place_ranks(int nprocs, BindTo bind_to) {
  Topology topology = load_topology();
  Placement placement;
  placement.cores = hwloc_get_nbobjs_by_type(topology.get(), HWLOC_OBJ_CORE);
  if (placement.cores <= 0) placement.cores = hwloc_get_nbobjs_by_type(topology.get(), HWLOC_OBJ_PU);
  placement.bind_to = bind_to;
  if (bind_to == BindTo::automatic) placement.bind_to = nprocs <= placement.cores ? BindTo::core : BindTo::none;
  placement.cpusets.assign(nprocs, std::nullopt);
  if (placement.bind_to == BindTo::none) return placement;

  hwloc_obj_type_t type = placement.bind_to == BindTo::core ? HWLOC_OBJ_CORE : HWLOC_OBJ_NUMANODE;
  int count = hwloc_get_nbobjs_by_type(topology.get(), type);
  if (count <= 0) return placement;  // e.g. no NUMA information: leave ranks unbound
  for (int rank = 0; rank < nprocs; ++rank) {
    hwloc_obj_t obj = hwloc_get_obj_by_type(topology.get(), type, static_cast<unsigned>(rank % count));
    cpu_set_t set;
    if (obj && hwloc_cpuset_to_glibc_sched_affinity(topology.get(), obj->cpuset, &set, sizeof set) == 0) {
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
