// What the memory cgroup knows about OOM kills (for "killed by the OOM killer" in the report).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace nodal::launcher {

/// The oom_kill count in a memory.events (cgroup v2) or memory.oom_control (v1) text; -1 if absent.
long parse_oom_kill(std::string_view text);

/// Files that may hold this process's oom_kill count, from a /proc/self/cgroup text, best first.
std::vector<std::string> oom_counter_paths(std::string_view proc_self_cgroup);

/// This process's memory cgroup oom_kill count now; -1 when the kernel does not say.
/// A rank killed by SIGKILL while this count rose was, in all likelihood, killed by the OOM killer.
long read_oom_kill_count();

}  // namespace nodal::launcher
