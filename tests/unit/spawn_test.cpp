// nodal::spawn with real child processes, for every start method.
//
// Ranks tell the test what they did through files: each writes <root>/rank-<r> holding its pid.
// The root directory is made once per test process, before main(), and published in
// NODAL_SPAWN_TEST_ROOT: children re-executed by StartMethod::spawn inherit it, and the fork
// server, a fork of this process made later, knows it already. The children run plain
// functions, the only kind StartMethod::forkserver accepts.
#include <nodal/cuda.hpp>
#include <nodal/errors.hpp>
#include <nodal/spawn.hpp>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using nodal::StartMethod;
using Clock = std::chrono::steady_clock;

constexpr const char* kRootVariable = "NODAL_SPAWN_TEST_ROOT";

/// The directory the ranks write to; removed when the process that made it ends.
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

const Root g_root;

fs::path record_path(const std::string& name, int rank) { return g_root.path / (name + "-" + std::to_string(rank)); }

/// In a child: records that `rank` ran, and as which process. Written then renamed, so that a
/// reader never sees half a file.
void record(int rank, const std::string& name = "rank") {
  const fs::path path = record_path(name, rank);
  const fs::path partial = path.string() + ".partial";
  std::ofstream(partial) << ::getpid();
  fs::rename(partial, path);
}

/// The pid each rank recorded; -1 for a rank that recorded nothing.
std::vector<pid_t> recorded(int nprocs, const std::string& name = "rank") {
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

bool all_recorded(int nprocs) {
  const std::vector<pid_t> pids = recorded(nprocs);
  return std::count(pids.begin(), pids.end(), -1) == 0;
}

/// No such process: it exited and was reaped.
bool gone(pid_t pid) { return ::kill(pid, 0) < 0 && errno == ESRCH; }

/// Gone, or a zombie: it exited and someone else (init, for an orphan) has yet to reap it.
bool dead(pid_t pid) {
  if (gone(pid)) return true;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  const std::string line{std::istreambuf_iterator<char>(stat), std::istreambuf_iterator<char>()};
  const std::size_t comm_end = line.rfind(')');
  return comm_end != std::string::npos && line.compare(comm_end, 3, ") Z") == 0;
}

[[noreturn]] void sleep_forever() {
  for (;;) ::pause();
}

// ---- What the children run ---------------------------------------------------------------

void record_rank(int rank) { record(rank); }

void record_second_call(int rank) { record(rank, "second"); }

void throw_in_rank_1(int rank) {
  record(rank);
  if (rank == 1) throw std::runtime_error("rank 1 gave up");
}

void exit_3_in_rank_1(int rank) {
  record(rank);
  if (rank == 1) ::_exit(3);
}

void abort_in_rank_1(int rank) {
  record(rank);
  if (rank == 1) {
    const rlimit no_core{0, 0};
    ::setrlimit(RLIMIT_CORE, &no_core);
    std::abort();
  }
}

constexpr int kHangingJob = 3;

/// Rank 1 throws once every rank has started; the others would sleep forever.
void rank_1_throws_others_hang(int rank) {
  record(rank);
  if (rank != 1) sleep_forever();
  wait_until([] { return all_recorded(kHangingJob); });
  throw std::runtime_error("rank 1 gave up");
}

/// The same, but rank 0 ignores SIGTERM: only the SIGKILL after the grace period stops it.
void rank_1_throws_rank_0_ignores_sigterm(int rank) {
  if (rank == 0) ::signal(SIGTERM, SIG_IGN);
  rank_1_throws_others_hang(rank);
}

// ---- Running StartMethod::spawn tests ----------------------------------------------------

/// True once this process has called nodal::spawn.
bool g_called_spawn = false;

/// StartMethod::spawn re-runs this test binary, and the child replays the test up to the same
/// nodal::spawn call, counted from the start of the process. ctest runs each test in a process of
/// its own, so the test's call is the first in parent and child alike. When one process runs
/// several tests, a spawn-method test that follows another spawn call runs alone in a fresh
/// process instead, and this process only checks that it passed. Returns true when it did so.
bool ran_in_fresh_process(StartMethod method) {
  if (method != StartMethod::spawn || !g_called_spawn) return false;
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string name = std::string(test->test_suite_name()) + "." + test->name();
  const std::string filter = "--gtest_filter=" + name;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/proc/self/exe", "spawn_test", filter.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << name << " failed in its own process (output above)";
  return true;
}

void spawn(void (*fn)(int), int nprocs, StartMethod method, std::chrono::milliseconds grace = 5s) {
  g_called_spawn = true;
  nodal::spawn(fn, nprocs, {method, grace});
}

const char* name_of(StartMethod method) {
  switch (method) {
    case StartMethod::spawn:
      return "spawn";
    case StartMethod::forkserver:
      return "forkserver";
    case StartMethod::fork:
      return "fork";
  }
  return "unknown";
}

class SpawnFixture : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const fs::directory_entry& entry : fs::directory_iterator(g_root.path)) fs::remove_all(entry.path());
  }
};

class SpawnTest : public SpawnFixture, public ::testing::WithParamInterface<StartMethod> {};

TEST_P(SpawnTest, EveryRankRunsInItsOwnProcess) {
  if (ran_in_fresh_process(GetParam())) return;
  spawn(&record_rank, 4, GetParam());
  const std::vector<pid_t> pids = recorded(4);
  for (pid_t pid : pids) {
    EXPECT_GT(pid, 0);
    EXPECT_NE(pid, ::getpid());
  }
  EXPECT_EQ(std::set<pid_t>(pids.begin(), pids.end()).size(), 4u);
  // Every child was reaped: no zombie is left (the fork server, when there is one, still runs).
  EXPECT_LE(::waitpid(-1, nullptr, WNOHANG), 0);
}

TEST_P(SpawnTest, ExceptionBecomesProcessRaisedError) {
  if (ran_in_fresh_process(GetParam())) return;
  try {
    spawn(&throw_in_rank_1, 2, GetParam());
    ADD_FAILURE() << "spawn returned";
  } catch (const nodal::ProcessRaisedError& e) {
    EXPECT_EQ(e.rank(), 1);
    EXPECT_EQ(e.pid(), recorded(2)[1]);
    EXPECT_EQ(e.child_report().rfind("std::runtime_error: rank 1 gave up\n", 0), 0u) << e.child_report();
    EXPECT_NE(e.child_report().find("\n 0# "), std::string::npos) << "no stack trace in: " << e.child_report();
    EXPECT_NE(std::string(e.what()).find("(rank 1) raised: std::runtime_error: rank 1 gave up"), std::string::npos)
        << e.what();
  }
}

TEST_P(SpawnTest, NonZeroExitBecomesProcessExitedError) {
  if (ran_in_fresh_process(GetParam())) return;
  try {
    spawn(&exit_3_in_rank_1, 2, GetParam());
    ADD_FAILURE() << "spawn returned";
  } catch (const nodal::ProcessExitedError& e) {
    EXPECT_EQ(e.rank(), 1);
    EXPECT_EQ(e.pid(), recorded(2)[1]);
    EXPECT_EQ(e.exit_code(), 3);
    EXPECT_EQ(e.signal(), 0);
  }
}

TEST_P(SpawnTest, DeathBySignalBecomesProcessExitedError) {
  if (ran_in_fresh_process(GetParam())) return;
  try {
    spawn(&abort_in_rank_1, 2, GetParam());
    ADD_FAILURE() << "spawn returned";
  } catch (const nodal::ProcessExitedError& e) {
    EXPECT_EQ(e.rank(), 1);
    EXPECT_EQ(e.exit_code(), 0);
    EXPECT_EQ(e.signal(), SIGABRT);
    EXPECT_NE(std::string(e.what()).find("SIGABRT"), std::string::npos) << e.what();
  }
}

TEST_P(SpawnTest, FailureTerminatesTheOtherRanks) {
  if (ran_in_fresh_process(GetParam())) return;
  const auto start = Clock::now();
  EXPECT_THROW(spawn(&rank_1_throws_others_hang, kHangingJob, GetParam(), 200ms), nodal::ProcessRaisedError);
  EXPECT_LT(Clock::now() - start, 5s);
  const std::vector<pid_t> pids = recorded(kHangingJob);
  for (int rank : {0, 2}) {
    ASSERT_GT(pids[rank], 0) << "rank " << rank << " never ran";
    EXPECT_TRUE(gone(pids[rank])) << "rank " << rank << " (pid " << pids[rank] << ") outlived spawn";
  }
}

TEST_P(SpawnTest, RankIgnoringSigtermIsKilledAfterTheGracePeriod) {
  if (ran_in_fresh_process(GetParam())) return;
  const auto start = Clock::now();
  try {
    spawn(&rank_1_throws_rank_0_ignores_sigterm, kHangingJob, GetParam(), 500ms);
    ADD_FAILURE() << "spawn returned";
  } catch (const nodal::ProcessRaisedError& e) {
    EXPECT_EQ(e.rank(), 1);  // rank 0's SIGKILL is a consequence, not the failure
  }
  const auto elapsed = Clock::now() - start;
  EXPECT_GE(elapsed, 500ms);
  EXPECT_LT(elapsed, 5s);
  const pid_t rank_0 = recorded(kHangingJob)[0];
  ASSERT_GT(rank_0, 0);
  EXPECT_TRUE(gone(rank_0));
}

TEST_P(SpawnTest, ChildrenDieWithTheirParent) {
  // spawn_hang's ranks hang; SIGKILL leaves spawn_hang no chance to stop them itself.
  const pid_t parent = ::fork();
  if (parent == 0) {
    ::execl(NODAL_SPAWN_HANG, "spawn_hang", name_of(GetParam()), g_root.path.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const bool started = wait_until([] { return all_recorded(2); });
  ::kill(parent, SIGKILL);
  ASSERT_EQ(::waitpid(parent, nullptr, 0), parent);
  ASSERT_TRUE(started) << "spawn_hang's ranks never ran";
  for (pid_t pid : recorded(2)) {
    EXPECT_TRUE(wait_until([pid] { return dead(pid); }, 5s)) << "pid " << pid << " outlived its parent";
  }
}

TEST_P(SpawnTest, ThreadsInTheParent) {
  if (ran_in_fresh_process(GetParam())) return;
  if (GetParam() == StartMethod::forkserver) nodal::start_forkserver();  // while single-threaded
  std::atomic<bool> stop{false};
  std::thread thread([&] {
    while (!stop) std::this_thread::sleep_for(1ms);
  });
  if (GetParam() == StartMethod::fork) {
    try {
      spawn(&record_rank, 2, GetParam());
      ADD_FAILURE() << "fork was not refused";
    } catch (const nodal::UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("runs 2 threads"), std::string::npos) << e.what();
    }
    EXPECT_EQ(recorded(2), std::vector<pid_t>(2, -1));
  } else {
    spawn(&record_rank, 2, GetParam());
    EXPECT_TRUE(all_recorded(2));
  }
  stop = true;
  thread.join();
}

TEST_P(SpawnTest, RejectsFewerThanOneProcess) {
  EXPECT_THROW(nodal::spawn(&record_rank, 0, {GetParam()}), nodal::UsageError);
  EXPECT_THROW(nodal::spawn(&record_rank, -1, {GetParam()}), nodal::UsageError);
}

INSTANTIATE_TEST_SUITE_P(Methods, SpawnTest,
                         ::testing::Values(StartMethod::spawn, StartMethod::forkserver, StartMethod::fork),
                         [](const ::testing::TestParamInfo<StartMethod>& param) { return name_of(param.param); });

TEST_F(SpawnFixture, ForkserverRefusesClosuresButRunsFunctionPointers) {
  const std::string name = "closure";
  try {
    nodal::spawn([name](int rank) { record(rank, name); }, 2, {StartMethod::forkserver});
    ADD_FAILURE() << "spawn returned";
  } catch (const nodal::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("plain function pointer"), std::string::npos) << e.what();
  }
  void (*const captureless)(int) = +[](int rank) { record(rank); };
  spawn(captureless, 2, StartMethod::forkserver);
  const std::vector<pid_t> pids = recorded(2);
  EXPECT_EQ(std::count(pids.begin(), pids.end(), -1), 0);
}

TEST_F(SpawnFixture, ForkserverCannotStartOnceThreadsRun) {
  // In a forked child: this process may have started its fork server already, the child has none.
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::atomic<bool> stop{false};
    std::thread thread([&] {
      while (!stop) std::this_thread::sleep_for(1ms);
    });
    int code = 1;
    try {
      nodal::start_forkserver();
    } catch (const nodal::UsageError& e) {
      code = std::string(e.what()).find("at the top of main()") != std::string::npos ? 0 : 2;
    }
    stop = true;
    thread.join();
    ::_exit(code);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: start_forkserver did not throw; 2: its message gave no advice";
}

TEST_F(SpawnFixture, ForkRefusedOnceCudaWasInitialised) {
  if (!nodal::cuda::built_with_cuda()) GTEST_SKIP() << "nodal was built without CUDA";
  // In a forked child: the mark "CUDA initialised" is for the life of a process. Asking whether
  // CUDA is available initialises it (with or without a driver and a GPU).
  const pid_t pid = ::fork();
  if (pid == 0) {
    (void)nodal::cuda::available();
    auto says_cuda = [](const nodal::UsageError& e) {
      const std::string what = e.what();
      return what.find("CUDA does not survive fork") != std::string::npos &&
             what.find("StartMethod::spawn") != std::string::npos;
    };
    int code = 0;
    try {
      nodal::spawn(&record_rank, 1, {StartMethod::fork});
      code = 1;
    } catch (const nodal::UsageError& e) {
      if (!says_cuda(e)) {
        std::fprintf(stderr, "fork: %s\n", e.what());
        code = 2;
      }
    }
    try {
      nodal::start_forkserver();
      code = code == 0 ? 3 : code;
    } catch (const nodal::UsageError& e) {
      if (!says_cuda(e)) {
        std::fprintf(stderr, "forkserver: %s\n", e.what());
        code = code == 0 ? 4 : code;
      }
    }
    ::_exit(code);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: spawn(fork) ran; 2: its message did not name CUDA; 3: start_forkserver "
                                       "started; 4: its message did not name CUDA";
  EXPECT_EQ(recorded(1), std::vector<pid_t>{-1}) << "a rank ran";
}

TEST_F(SpawnFixture, SpawnedChildSkipsTheCallsBeforeItsOwn) {
  if (ran_in_fresh_process(StartMethod::spawn)) return;
  spawn(&record_rank, 2, StartMethod::fork);  // call #1: returns at once in the children of call #2
  const std::vector<pid_t> first = recorded(2);
  spawn(&record_second_call, 2, StartMethod::spawn);
  EXPECT_EQ(recorded(2), first) << "a child of call #2 ran call #1's children again";
  for (pid_t pid : recorded(2, "second")) {
    EXPECT_GT(pid, 0);
    EXPECT_EQ(std::count(first.begin(), first.end(), pid), 0);
  }
}

TEST_F(SpawnFixture, SpawnedChildThatMissesItsCallIsReported) {
  if (ran_in_fresh_process(StartMethod::spawn)) return;
  // The children inherit the mark and so take the other branch: they never reach the call.
  constexpr const char* kMark = "NODAL_SPAWN_TEST_MARK";
  if (std::getenv(kMark) != nullptr) return;
  ::setenv(kMark, "1", 1);
  try {
    spawn(&record_rank, 2, StartMethod::spawn);
    ADD_FAILURE() << "spawn returned";
  } catch (const nodal::ProcessRaisedError& e) {
    EXPECT_NE(e.child_report().find("ended without reaching the call that started it (call #1"), std::string::npos)
        << e.child_report();
  }
  ::unsetenv(kMark);
  EXPECT_EQ(recorded(2), std::vector<pid_t>(2, -1));
}

}  // namespace
