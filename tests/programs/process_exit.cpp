// A parent of nodal::Process children, for process_test: what becomes of them when it ends.
// Usage: process_exit spawn|forkserver|fork <dir> exit|raise|hang
//   exit   starts a daemonic and a non-daemonic child, drops both Process objects while they run,
//          and returns from main once both have recorded themselves. The daemon writes
//          <dir>/daemon-0 (its pid), then sleeps; on SIGTERM it writes <dir>/daemon_terminated-0
//          and exits 0 (PR_SET_PDEATHSIG's SIGKILL would leave no such file). The other writes
//          <dir>/worker-0, sleeps 300 ms, and writes <dir>/worker_done-0: only a parent that
//          joins it at exit lets it get there.
//   raise  starts a non-daemonic child whose target throws, never joins it, and returns.
//   hang   starts a non-daemonic child that writes <dir>/hang-0 and sleeps; the test SIGKILLs us.
// Targets are plain functions (StartMethod::forkserver); they find <dir> in a global set first.
#include <nodal/process.hpp>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

fs::path g_dir;
char g_terminated_path[4096];  ///< for the SIGTERM handler, which may not allocate

/// Writes <dir>/<name>-0 holding our pid, whole or not at all (as spawn_support.hpp's record).
void record(const std::string& name) {
  const fs::path path = g_dir / (name + "-0");
  std::ofstream(path.string() + ".partial") << ::getpid();
  fs::rename(path.string() + ".partial", path);
}

bool recorded(const std::string& name) { return fs::exists(g_dir / (name + "-0")); }

void on_sigterm(int) {
  ::close(::open(g_terminated_path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
  ::_exit(0);
}

void daemon_target() {
  ::signal(SIGTERM, &on_sigterm);
  record("daemon");
  for (;;) ::pause();
}

void worker_target() {
  record("worker");
  std::this_thread::sleep_for(300ms);
  record("worker_done");
}

void raising_target() { throw std::runtime_error("unjoined target gave up"); }

void hanging_target() {
  record("hang");
  for (;;) ::pause();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: process_exit spawn|forkserver|fork <dir> exit|raise|hang\n");
    return 2;
  }
  const std::string_view method = argv[1];
  g_dir = argv[2];
  const std::string_view mode = argv[3];
  const std::string terminated = (g_dir / "daemon_terminated-0").string();
  std::strncpy(g_terminated_path, terminated.c_str(), sizeof g_terminated_path - 1);

  nodal::ProcessOptions options;
  options.start_method = method == "fork"         ? nodal::StartMethod::fork
                         : method == "forkserver" ? nodal::StartMethod::forkserver
                                                  : nodal::StartMethod::spawn;
  if (mode == "exit") {
    {
      nodal::ProcessOptions daemonic = options;
      daemonic.daemon = true;
      nodal::Process daemon(&daemon_target, daemonic);
      nodal::Process worker(&worker_target, options);
      daemon.start();
      worker.start();
      while (!recorded("daemon") || !recorded("worker")) std::this_thread::sleep_for(1ms);
    }  // both objects go; their children run on, and the exit handler sees to them
    return 0;
  }
  if (mode == "raise") {
    nodal::Process(&raising_target, options).start();
    return 0;
  }
  if (mode == "hang") {
    nodal::Process hang(&hanging_target, options);
    hang.start();
    hang.join();
    return 1;  // not reached: the child never ends and the test kills us
  }
  std::fprintf(stderr, "process_exit: unknown mode %s\n", argv[3]);
  return 2;
}
