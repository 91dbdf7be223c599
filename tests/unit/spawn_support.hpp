// What the tests of nodal::spawn, nodal::ProcessContext and nodal::Process share: children that
// tell the test what they did through files, and the rules for running StartMethod::spawn tests.
//
// Children write <root>/<name>-<r> holding their pid. The root directory is made once per test
// process, before main(), and published in NODAL_SPAWN_TEST_ROOT: children re-executed by
// StartMethod::spawn inherit it, and the fork server, a fork of this process made later, knows it
// already. The children run plain functions, the only kind StartMethod::forkserver accepts.
#pragma once

#include <nodal/spawn.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace spawn_support {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

inline constexpr const char* kRootVariable = "NODAL_SPAWN_TEST_ROOT";

/// The directory the children write to; removed when the process that made it ends.
struct Root {
  fs::path path;
  pid_t owner = -1;  ///< -1 when inherited

  Root() {
    if (const char* inherited = std::getenv(kRootVariable)) {
      path = inherited;
      return;
    }
    std::string name = (fs::temp_directory_path() / "nodal-spawn-test-XXXXXX").string();
    if (::mkdtemp(name.data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
    ::setenv(kRootVariable, name.c_str(), 1);
    path = name;
    owner = ::getpid();
  }
  ~Root() {
    std::error_code ignored;
    if (owner == ::getpid()) fs::remove_all(path, ignored);
  }
  Root(const Root&) = delete;
  Root& operator=(const Root&) = delete;
};

inline const Root g_root;

inline fs::path record_path(const std::string& name, int rank) {
  return g_root.path / (name + "-" + std::to_string(rank));
}

/// In a child: records that `rank` ran, and as which process. Written then renamed, so that a
/// reader never sees half a file.
inline void record(int rank, const std::string& name = "rank") {
  const fs::path path = record_path(name, rank);
  const fs::path partial = path.string() + ".partial";
  std::ofstream(partial) << ::getpid();
  fs::rename(partial, path);
}

/// The pid each rank recorded; -1 for a rank that recorded nothing.
inline std::vector<pid_t> recorded(int nprocs, const std::string& name = "rank") {
  std::vector<pid_t> pids;
  for (int rank = 0; rank < nprocs; ++rank) {
    pid_t pid = -1;
    std::ifstream(record_path(name, rank)) >> pid;
    pids.push_back(pid);
  }
  return pids;
}

/// Polls until pred() holds or `timeout` passes; returns pred()'s last value.
template <class Pred>
bool wait_until(Pred pred, std::chrono::milliseconds timeout = 10s) {
  for (const auto deadline = Clock::now() + timeout; !pred() && Clock::now() < deadline;) {
    std::this_thread::sleep_for(1ms);
  }
  return pred();
}

inline bool all_recorded(int nprocs, const std::string& name = "rank") {
  const std::vector<pid_t> pids = recorded(nprocs, name);
  return std::count(pids.begin(), pids.end(), -1) == 0;
}

/// No such process: it exited and was reaped.
inline bool gone(pid_t pid) { return ::kill(pid, 0) < 0 && errno == ESRCH; }

/// Gone, or a zombie: it exited and someone else (init, for an orphan) has yet to reap it.
inline bool dead(pid_t pid) {
  if (gone(pid)) return true;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  const std::string line{std::istreambuf_iterator<char>(stat), std::istreambuf_iterator<char>()};
  const std::size_t comm_end = line.rfind(')');
  return comm_end != std::string::npos && line.compare(comm_end, 3, ") Z") == 0;
}

[[noreturn]] inline void sleep_forever() {
  for (;;) ::pause();
}

inline const char* name_of(nodal::StartMethod method) {
  switch (method) {
    case nodal::StartMethod::spawn:
      return "spawn";
    case nodal::StartMethod::forkserver:
      return "forkserver";
    case nodal::StartMethod::fork:
      return "fork";
  }
  return "unknown";
}

/// True once this process has started children (nodal::spawn, Process::start).
inline bool g_started_children = false;

/// StartMethod::spawn re-runs this test binary, and the child replays the test up to the same
/// start (spawn call or Process::start), counted from the start of the process. ctest runs each
/// test in a process of its own, so the test's starts are numbered alike in parent and child.
/// When one process runs several tests, a spawn-method test that follows another start runs alone
/// in a fresh process instead, and this process only checks that it passed. Returns true when it
/// did so.
inline bool ran_in_fresh_process(nodal::StartMethod method) {
  if (method != nodal::StartMethod::spawn || !g_started_children) return false;
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string name = std::string(test->test_suite_name()) + "." + test->name();
  const std::string filter = "--gtest_filter=" + name;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/proc/self/exe", program_invocation_short_name, filter.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << name << " failed in its own process (output above)";
  return true;
}

/// Clears the root after each test.
class SpawnFixture : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const fs::directory_entry& entry : fs::directory_iterator(g_root.path)) fs::remove_all(entry.path());
  }
};

}  // namespace spawn_support
