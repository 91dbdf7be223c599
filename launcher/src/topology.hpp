// This machine's hardware topology as nodalrun needs it, loaded once per process.
#pragma once

#include <hwloc.h>

namespace nodal::launcher {

/// Cores, PUs and NUMA nodes (no I/O objects, caches or groups; hwloc's plugins and its x86 cpuid
/// pass kept out, since Linux's /sys says the same): ~0.5 ms instead of ~4 ms with plugins, ~13
/// ms with I/O discovery on this VM. Loaded at the first call and kept for the process's life:
/// placement reads it, and the PMIx server (pmi/pmix_host.cpp) keeps the pointer as long as it
/// runs. Throws std::runtime_error when hwloc cannot read the topology.
hwloc_topology_t node_topology();

}  // namespace nodal::launcher
