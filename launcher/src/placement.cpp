#include "placement.hpp"

#include <hwloc.h>
#include <hwloc/glibc-sched.h>

#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace nodal::launcher {
namespace {

using Topology = std::unique_ptr<hwloc_topology, decltype(&hwloc_topology_destroy)>;

Topology load_topology() {
  // hwloc dlopen()s its plugins (PCI, OpenCL, GL, libxml2) on the first init: ~3.4 ms of nodalrun's
  // ~4 ms topology load here, for I/O objects that say nothing about CPU placement. Keep them out
  // (unless the user already chose a list), and put the environment back for the ranks.
  const bool had_blacklist = std::getenv("HWLOC_PLUGINS_BLACKLIST") != nullptr;
  if (!had_blacklist) ::setenv("HWLOC_PLUGINS_BLACKLIST", "hwloc_pci,hwloc_opencl,hwloc_gl,hwloc_xml_libxml,hwloc_cuda,hwloc_nvml,hwloc_rsmi,hwloc_levelzero", 1);
  hwloc_topology_t raw = nullptr;
  int rc = hwloc_topology_init(&raw);
  if (!had_blacklist) ::unsetenv("HWLOC_PLUGINS_BLACKLIST");
  if (rc != 0) throw std::runtime_error("hwloc_topology_init failed");
  Topology topology(raw, &hwloc_topology_destroy);
  // Cores, PUs and NUMA nodes are all placement needs: no I/O objects, caches or groups, and no
  // cpuid pass over every CPU (the x86 backend) since Linux's /sys says the same.
  hwloc_topology_set_io_types_filter(raw, HWLOC_TYPE_FILTER_KEEP_NONE);
  hwloc_topology_set_cache_types_filter(raw, HWLOC_TYPE_FILTER_KEEP_NONE);
  hwloc_topology_set_type_filter(raw, HWLOC_OBJ_GROUP, HWLOC_TYPE_FILTER_KEEP_NONE);
  hwloc_topology_set_components(raw, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, "x86");
  if (hwloc_topology_load(raw) != 0) throw std::runtime_error("hwloc_topology_load failed");
  return topology;
}

}  // namespace

Placement place_ranks(int nprocs, BindTo bind_to) {
  Placement placement;
  placement.cpusets.assign(nprocs, std::nullopt);
  // No binding wanted, or more ranks than CPUs (so more than cores): no topology needed.
  cpu_set_t allowed;
  int cpus = ::sched_getaffinity(0, sizeof allowed, &allowed) == 0 ? CPU_COUNT(&allowed) : 0;
  if (bind_to == BindTo::none || (bind_to == BindTo::automatic && cpus > 0 && nprocs > cpus)) {
    placement.bind_to = BindTo::none;
    placement.cores = 0;
    return placement;
  }
  Topology topology = load_topology();
  placement.cores = hwloc_get_nbobjs_by_type(topology.get(), HWLOC_OBJ_CORE);
  if (placement.cores <= 0) placement.cores = hwloc_get_nbobjs_by_type(topology.get(), HWLOC_OBJ_PU);
  placement.bind_to = bind_to;
  if (bind_to == BindTo::automatic) placement.bind_to = nprocs <= placement.cores ? BindTo::core : BindTo::none;
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
