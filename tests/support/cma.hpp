// Whether this kernel lets sibling ranks copy each other's memory (cross-memory attach:
// process_vm_readv/writev), for the tests of nodal's cma paths.
#pragma once

#include <fstream>

namespace nodal::testing {

/// Yama's ptrace_scope (0 where Yama is absent). At 1 each rank lets its siblings attach
/// (PR_SET_PTRACER_ANY, collectives/src/comm_state.cpp cma_allowed); above 1 the kernel forbids
/// process_vm_readv and process_vm_writev between sibling ranks, so nodal stages what cma would
/// copy.
inline int yama_ptrace_scope() {
  std::ifstream yama("/proc/sys/kernel/yama/ptrace_scope");
  int scope = 0;
  return yama && (yama >> scope) ? scope : 0;
}

/// Whether nodal's cma paths can run here.
inline bool kernel_allows_cma() { return yama_ptrace_scope() <= 1; }

}  // namespace nodal::testing
