#include "cgroup.hpp"

#include <fstream>
#include <sstream>

namespace nodal::launcher {

long parse_oom_kill(std::string_view text) {
  std::istringstream in{std::string(text)};
  std::string key;
  long value = 0;
  while (in >> key >> value) {
    if (key == "oom_kill") return value;
  }
  return -1;
}

std::vector<std::string> oom_counter_paths(std::string_view proc_self_cgroup) {
  std::vector<std::string> paths;
  std::istringstream in{std::string(proc_self_cgroup)};
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("0::", 0) == 0) {  // cgroup v2: "0::/path"
      std::string dir = line.substr(3) == "/" ? "" : line.substr(3);
      paths.push_back("/sys/fs/cgroup" + dir + "/memory.events");
    } else if (auto pos = line.find(":memory:"); pos != std::string::npos) {  // v1: "4:memory:/path"
      std::string dir = line.substr(pos + 8) == "/" ? "" : line.substr(pos + 8);
      paths.push_back("/sys/fs/cgroup/memory" + dir + "/memory.oom_control");
    }
  }
  return paths;
}

long read_oom_kill_count() {
  std::ifstream cgroup("/proc/self/cgroup");
  std::stringstream text;
  text << cgroup.rdbuf();
  for (const std::string& path : oom_counter_paths(text.str())) {
    std::ifstream file(path);
    if (!file) continue;
    std::stringstream content;
    content << file.rdbuf();
    if (long count = parse_oom_kill(content.str()); count >= 0) return count;
  }
  return -1;
}

}  // namespace nodal::launcher
