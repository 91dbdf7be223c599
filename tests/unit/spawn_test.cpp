// nodal::spawn and its ProcessContext with real child processes, for every start method.
// The children report through files (spawn_support.hpp).
#include <nodal/cuda.hpp>
#include <nodal/errors.hpp>
#include <nodal/spawn.hpp>

#include "spawn_support.hpp"

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace {

using namespace spawn_support;
using nodal::StartMethod;

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

void record_and_hang(int rank) {
  record(rank);
  sleep_forever();
}

fs::path go_path() { return g_root.path / "go"; }

/// Records itself, then waits until the test creates <root>/go (exit code 7 if it never does).
void record_and_wait_for_go(int rank) {
  record(rank);
  if (!wait_until([] { return fs::exists(go_path()); }, 30s)) ::_exit(7);
}

// ---- Running the tests -------------------------------------------------------------------

void spawn(void (*fn)(int), int nprocs, StartMethod method, std::chrono::milliseconds grace = 5s) {
  g_started_children = true;
  nodal::spawn(fn, nprocs, {method, grace});
}

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

// ---- spawn(..., {.join = false}) and its ProcessContext --------------------------------------

/// spawn(fn, nprocs, {.join = false}) with the test's start method.
nodal::ProcessContext start_unjoined(void (*fn)(int), int nprocs, StartMethod method,
                                     std::chrono::milliseconds grace = 5s) {
  g_started_children = true;
  return nodal::spawn(fn, nprocs, {.start_method = method, .grace = grace, .join = false});
}

TEST_P(SpawnTest, JoiningSpawnReturnsAJoinedContext) {
  if (ran_in_fresh_process(GetParam())) return;
  g_started_children = true;
  nodal::ProcessContext context = nodal::spawn(&record_rank, 2, {.start_method = GetParam()});
  EXPECT_EQ(context.pids(), recorded(2));
  EXPECT_TRUE(context.join(0ms));
}

TEST_P(SpawnTest, ContextJoinTimesOutWhileChildrenRun) {
  if (ran_in_fresh_process(GetParam())) return;
  nodal::ProcessContext context = start_unjoined(&record_and_wait_for_go, 3, GetParam());
  const std::vector<pid_t> pids = context.pids();
  ASSERT_EQ(pids.size(), 3u);
  ASSERT_TRUE(wait_until([] { return all_recorded(3); }));
  EXPECT_EQ(recorded(3), pids) << "pids() is not by rank";
  EXPECT_FALSE(context.join(0ms));
  const auto start = Clock::now();
  EXPECT_FALSE(context.join(100ms));
  EXPECT_GE(Clock::now() - start, 100ms);
  for (pid_t pid : pids) EXPECT_FALSE(dead(pid));
  std::ofstream(go_path()).close();
  EXPECT_TRUE(context.join(10s));
  EXPECT_TRUE(context.join());  // and stays joined
  for (pid_t pid : pids) EXPECT_TRUE(gone(pid)) << "pid " << pid << " was not reaped";
}

TEST_P(SpawnTest, ContextJoinThrowsTheFirstFailureAfterStoppingTheOthers) {
  if (ran_in_fresh_process(GetParam())) return;
  nodal::ProcessContext context = start_unjoined(&rank_1_throws_others_hang, kHangingJob, GetParam(), 200ms);
  const std::vector<pid_t> pids = context.pids();
  const auto start = Clock::now();
  try {
    while (!context.join(50ms)) {
    }
    ADD_FAILURE() << "join returned true";
  } catch (const nodal::ProcessRaisedError& e) {
    EXPECT_EQ(e.rank(), 1);
    EXPECT_EQ(e.pid(), pids[1]);
    EXPECT_EQ(e.child_report().rfind("std::runtime_error: rank 1 gave up\n", 0), 0u) << e.child_report();
  }
  EXPECT_LT(Clock::now() - start, 5s);
  for (pid_t pid : pids) EXPECT_TRUE(gone(pid)) << "pid " << pid << " outlived the failed join";
  EXPECT_THROW(context.join(0ms), nodal::ProcessRaisedError);  // the same error, every time
}

TEST_P(SpawnTest, DroppedContextKillsAndReapsItsChildren) {
  if (ran_in_fresh_process(GetParam())) return;
  std::vector<pid_t> pids;
  {
    nodal::ProcessContext context = start_unjoined(&record_and_hang, 2, GetParam());
    pids = context.pids();
    ASSERT_TRUE(wait_until([] { return all_recorded(2); }));
  }
  for (pid_t pid : pids) {
    if (GetParam() == StartMethod::forkserver) {  // the server's children: it reaps them as they die
      EXPECT_TRUE(wait_until([pid] { return gone(pid); }, 5s)) << "pid " << pid << " outlived its context";
    } else {
      EXPECT_TRUE(gone(pid)) << "pid " << pid << " outlived its context, or is a zombie";
    }
  }
  EXPECT_LE(::waitpid(-1, nullptr, WNOHANG), 0) << "a zombie is left";
}

TEST_P(SpawnTest, ContextsRunSideBySide) {
  if (ran_in_fresh_process(GetParam())) return;
  nodal::ProcessContext first = start_unjoined(&record_and_wait_for_go, 2, GetParam());
  nodal::ProcessContext second = start_unjoined(&record_second_call, 2, GetParam());
  EXPECT_TRUE(second.join(10s)) << "the second context did not run while the first one did";
  EXPECT_TRUE(all_recorded(2, "second"));
  EXPECT_FALSE(first.join(0ms));
  std::ofstream(go_path()).close();
  EXPECT_TRUE(first.join(10s));
}

TEST_F(SpawnFixture, AContextNobodyJoinsDoesNotStallTheForkServer) {
  // Their exits are more news than a socket holds: a server that waited for room to send it would
  // start nothing else until the context is joined.
  constexpr int kUnread = 400;
  nodal::ProcessContext unread = start_unjoined(&record_rank, kUnread, StartMethod::forkserver);
  ASSERT_TRUE(wait_until([&] { return all_recorded(kUnread); }, 30s));
  nodal::ProcessContext second = start_unjoined(&record_second_call, 2, StartMethod::forkserver);
  EXPECT_TRUE(second.join(10s));
  EXPECT_TRUE(unread.join(30s));
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
