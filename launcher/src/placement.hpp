// Where each rank runs: CPU sets from the machine's topology (hwloc).
#pragma once

#include <sched.h>

#include <optional>
#include <vector>

#include "options.hpp"

namespace nodal::launcher {

struct Placement {
  /// The effective policy (automatic resolved to core or none).
  BindTo bind_to = BindTo::none;
  /// One entry per rank; nullopt: not bound.
  std::vector<std::optional<cpu_set_t>> cpusets;
  int cores = 0;  ///< 0 when the topology was not needed (no binding)
  /// More ranks than cores (or than the CPUs this process may use, when the topology was not needed).
  bool crowded = false;
};

/// Loads the topology once (cores, PUs and NUMA nodes only; no plugins, no I/O discovery) and assigns rank r to core r % cores (core) or
/// NUMA node r % nodes (numa). automatic: core while nprocs <= cores, else none (oversubscribed
/// ranks pinned to shared cores would only stop the kernel from balancing them).
/// Throws std::runtime_error when hwloc cannot read the topology.
Placement place_ranks(int nprocs, BindTo bind_to);

/// "core 0-1" style description of a CPU set, for messages and the report.
std::string describe_cpuset(const cpu_set_t& set);

}  // namespace nodal::launcher
