#include "topology.hpp"

#include <cstdlib>
#include <stdexcept>

namespace nodal::launcher {

hwloc_topology_t node_topology() {
  static hwloc_topology_t loaded = nullptr;
  if (loaded != nullptr) return loaded;
  // hwloc dlopen()s its plugins (PCI, OpenCL, GL, libxml2) on the first init: ~3.4 ms here, for
  // I/O objects that say nothing about CPU placement. Keep them out (unless the user already
  // chose a list), and put the environment back for the ranks.
  const bool had_blacklist = std::getenv("HWLOC_PLUGINS_BLACKLIST") != nullptr;
  if (!had_blacklist) {
    ::setenv("HWLOC_PLUGINS_BLACKLIST",
             "hwloc_pci,hwloc_opencl,hwloc_gl,hwloc_xml_libxml,hwloc_cuda,hwloc_nvml,hwloc_rsmi,hwloc_levelzero", 1);
  }
  hwloc_topology_t raw = nullptr;
  const int rc = hwloc_topology_init(&raw);
  if (!had_blacklist) ::unsetenv("HWLOC_PLUGINS_BLACKLIST");
  if (rc != 0) throw std::runtime_error("hwloc_topology_init failed");
  hwloc_topology_set_io_types_filter(raw, HWLOC_TYPE_FILTER_KEEP_NONE);
  hwloc_topology_set_cache_types_filter(raw, HWLOC_TYPE_FILTER_KEEP_NONE);
  hwloc_topology_set_type_filter(raw, HWLOC_OBJ_GROUP, HWLOC_TYPE_FILTER_KEEP_NONE);
  hwloc_topology_set_components(raw, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, "x86");
  if (hwloc_topology_load(raw) != 0) {
    hwloc_topology_destroy(raw);
    throw std::runtime_error("hwloc_topology_load failed");
  }
  loaded = raw;
  return loaded;
}

}  // namespace nodal::launcher
