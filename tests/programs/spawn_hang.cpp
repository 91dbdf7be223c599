// A parent whose nodal::spawn children hang: spawn_test SIGKILLs it and checks that its children
// die with it (no orphans).
// Usage: spawn_hang spawn|forkserver|fork <dir>. Each rank writes <dir>/rank-<r> holding its pid,
// then sleeps forever.
#include <nodal/spawn.hpp>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace {

std::filesystem::path g_dir;  // set before the spawn call, so every start method's children see it

void record_and_hang(int rank) {
  const std::filesystem::path path = g_dir / ("rank-" + std::to_string(rank));
  std::ofstream(path.string() + ".partial") << ::getpid();
  std::filesystem::rename(path.string() + ".partial", path);
  for (;;) ::pause();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: spawn_hang spawn|forkserver|fork <dir>\n");
    return 2;
  }
  const std::string_view method = argv[1];
  g_dir = argv[2];
  nodal::SpawnOptions options;
  options.start_method = method == "fork"         ? nodal::StartMethod::fork
                         : method == "forkserver" ? nodal::StartMethod::forkserver
                                                  : nodal::StartMethod::spawn;
  nodal::spawn(&record_and_hang, 2, options);
  return 1;  // not reached: the ranks never return
}
