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

/// This nodalrun's ranks among all the ranks on its machine: several nodalruns of a job across
/// nodes may share one machine (two agents on one host are two nodes: the loopback tests, a
/// cluster of network namespaces or containers). Alone: {0, nprocs}. Not handled: nodalruns on
/// one machine that were each given CPUs of their own (cgroups) still count each other's ranks
/// as if they shared the cores.
struct HostShare {
  int first = 0;  ///< how many of the host's ranks come before this nodalrun's
  int ranks = 0;  ///< the host's ranks, this nodalrun's included
};

/// Loads the topology once (cores, PUs and NUMA nodes only; no plugins, no I/O discovery) and
/// assigns rank r to core (share.first + r) % cores (core) or NUMA node (share.first + r) % nodes
/// (numa). automatic: core while the host's ranks fit its cores, else none (oversubscribed ranks
/// pinned to shared cores would only stop the kernel from balancing them). `crowded` counts the
/// host's ranks too. Throws std::runtime_error when hwloc cannot read the topology.
Placement place_ranks(int nprocs, BindTo bind_to, HostShare share);

/// "core 0-1" style description of a CPU set, for messages and the report.
std::string describe_cpuset(const cpu_set_t& set);

}  // namespace nodal::launcher
