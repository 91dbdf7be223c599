// Whether this kernel lets sibling ranks copy each other's memory (cross-memory attach:
// process_vm_readv/writev), for the tests of nodal's cma paths.
#pragma once

#include <fstream>

namespace nodal::testing {

/// Yama's ptrace_scope (0 where Yama is absent). Above 0 the kernel forbids process_vm_readv and
/// process_vm_writev between sibling ranks, so nodal stages what cma would copy.
inline int yama_ptrace_scope() {
  std::ifstream yama("/proc/sys/kernel/yama/ptrace_scope");
  int scope = 0;
  return yama && (yama >> scope) ? scope : 0;
}

}  // namespace nodal::testing
