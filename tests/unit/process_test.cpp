// nodal::Process with real child processes, for every start method: how a child's end reads in
// join() and exitcode(), terminate() and kill(), timeouts, and what becomes of children when their
// parent exits (tests/programs/process_exit.cpp). The children report through files
// (spawn_support.hpp).
#include <nodal/errors.hpp>
#include <nodal/process.hpp>
#include <nodal/detail/termination_shield.hpp>

#include "child_process.hpp"
#include "spawn_support.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace {

using namespace spawn_support;
using nodal::Process;
using nodal::StartMethod;

// ---- What the children run ---------------------------------------------------------------

void record_process() { record(0, "process"); }

void exit_3() {
  record_process();
  ::_exit(3);
}

void throw_runtime_error() {
  record_process();
  throw std::runtime_error("target gave up");
}

void hang() {
  record_process();
  sleep_forever();
}

fs::path go_path() { return g_root.path / "go"; }

/// Records itself, then waits until the test creates <root>/go (exit code 7 if it never does).
void wait_for_go() {
  record_process();
  if (!wait_until([] { return fs::exists(go_path()); }, 30s)) ::_exit(7);
}

void record_second() { record(0, "second"); }

/// Spends 300 ms in a section shielded from SIGTERM (as an arena allocation or a queue's cell
/// update is): records "entered", and "left" once the section ran to its end.
void shielded_section() {
  {
    const nodal::detail::TerminationShield shield;
    record(0, "entered");
    std::this_thread::sleep_for(300ms);
    record(0, "left");
  }
  sleep_forever();  // the SIGTERM held back ends the process as the section ends: never reached
}

/// As shielded_section, but the SIGTERM comes during the outer section and an inner one is
/// entered after it (as find_or_create's section calls allocate's): both must run to their end.
void nested_shielded_sections() {
  {
    const nodal::detail::TerminationShield outer;
    record(0, "entered");
    std::this_thread::sleep_for(300ms);
    {
      const nodal::detail::TerminationShield inner;
      record(0, "inner");
    }
    record(0, "left");
  }
  sleep_forever();
}

// ---- Running the tests -------------------------------------------------------------------

/// A Process of `target` by the test's start method; marks that this process started children.
Process make(void (*target)(), StartMethod method) {
  g_started_children = true;
  return Process(target, {.start_method = method});
}

bool exited_with(pid_t pid) { return pid > 0 && gone(pid); }

class ProcessTest : public SpawnFixture, public ::testing::WithParamInterface<StartMethod> {};

TEST_P(ProcessTest, CleanExit) {
  if (ran_in_fresh_process(GetParam())) return;
  Process process = make(&record_process, GetParam());
  EXPECT_FALSE(process.is_alive());
  EXPECT_EQ(process.exitcode(), std::nullopt);
  EXPECT_EQ(process.pid(), std::nullopt);
  process.start();
  ASSERT_TRUE(process.pid().has_value());
  EXPECT_NE(*process.pid(), ::getpid());
  EXPECT_TRUE(process.join());
  EXPECT_EQ(process.exitcode(), 0);
  EXPECT_FALSE(process.is_alive());
  EXPECT_EQ(recorded(1, "process"), std::vector<pid_t>{*process.pid()});
  EXPECT_TRUE(exited_with(*process.pid())) << "the child was not reaped";
  EXPECT_LE(::waitpid(-1, nullptr, WNOHANG), 0) << "a zombie is left";
}

TEST_P(ProcessTest, NonZeroExitIsProcessExitedError) {
  if (ran_in_fresh_process(GetParam())) return;
  Process process = make(&exit_3, GetParam());
  process.start();
  for (int attempt = 0; attempt < 2; ++attempt) {  // every join says it again
    try {
      process.join();
      ADD_FAILURE() << "join returned";
    } catch (const nodal::ProcessExitedError& e) {
      EXPECT_EQ(e.exit_code(), 3);
      EXPECT_EQ(e.signal(), 0);
      EXPECT_EQ(e.pid(), *process.pid());
      EXPECT_EQ(e.name(), process.name());
      EXPECT_NE(std::string(e.what()).find("(" + process.name() + ") exited with code 3"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(process.exitcode(), 3);
}

TEST_P(ProcessTest, ExceptionIsProcessRaisedErrorWithTheChildsStack) {
  if (ran_in_fresh_process(GetParam())) return;
  Process process = make(&throw_runtime_error, GetParam());
  process.start();
  try {
    process.join();
    ADD_FAILURE() << "join returned";
  } catch (const nodal::ProcessRaisedError& e) {
    EXPECT_EQ(e.pid(), *process.pid());
    EXPECT_EQ(e.pid(), recorded(1, "process")[0]);
    EXPECT_EQ(e.child_report().rfind("std::runtime_error: target gave up\n", 0), 0u) << e.child_report();
    EXPECT_NE(e.child_report().find("\n 0# "), std::string::npos) << "no stack trace in: " << e.child_report();
    EXPECT_NE(std::string(e.what()).find("(" + process.name() + ") raised: std::runtime_error: target gave up"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(process.exitcode(), 1);
}

TEST_P(ProcessTest, TerminateEndsTheChildWithoutAnError) {
  if (ran_in_fresh_process(GetParam())) return;
  Process process = make(&hang, GetParam());
  process.start();
  ASSERT_TRUE(wait_until([] { return all_recorded(1, "process"); }));
  EXPECT_TRUE(process.is_alive());
  EXPECT_EQ(process.exitcode(), std::nullopt);
  process.terminate();
  EXPECT_TRUE(process.join(10s));
  EXPECT_EQ(process.exitcode(), -SIGTERM);
  EXPECT_FALSE(process.is_alive());
  EXPECT_TRUE(exited_with(*process.pid()));
  process.terminate();  // after the exit: nothing to do
}

TEST_P(ProcessTest, TerminateWaitsForTheChildToLeaveAShieldedSection) {
  if (ran_in_fresh_process(GetParam())) return;
  Process process = make(&shielded_section, GetParam());
  process.start();
  ASSERT_TRUE(wait_until([] { return all_recorded(1, "entered"); }));
  process.terminate();
  EXPECT_TRUE(process.join(10s));
  EXPECT_EQ(process.exitcode(), -SIGTERM) << "SIGTERM still ends the child, by its default action";
  EXPECT_TRUE(all_recorded(1, "left")) << "SIGTERM cut the shielded section short";
}

TEST_P(ProcessTest, ASectionEnteredInsideAnotherAfterSigtermRunsToo) {
  if (ran_in_fresh_process(GetParam())) return;
  Process process = make(&nested_shielded_sections, GetParam());
  process.start();
  ASSERT_TRUE(wait_until([] { return all_recorded(1, "entered"); }));
  process.terminate();
  EXPECT_TRUE(process.join(10s)) << "the child hung in its inner section";
  EXPECT_EQ(process.exitcode(), -SIGTERM);
  EXPECT_TRUE(all_recorded(1, "inner"));
  EXPECT_TRUE(all_recorded(1, "left"));
}

TEST_P(ProcessTest, KillEndsTheChildWithoutAnError) {
  if (ran_in_fresh_process(GetParam())) return;
  Process process = make(&hang, GetParam());
  process.start();
  ASSERT_TRUE(wait_until([] { return all_recorded(1, "process"); }));
  process.kill();
  EXPECT_TRUE(process.join(10s));
  EXPECT_EQ(process.exitcode(), -SIGKILL);
}

TEST_P(ProcessTest, SignalFromElsewhereIsProcessExitedError) {
  if (ran_in_fresh_process(GetParam())) return;
  Process process = make(&hang, GetParam());
  process.start();
  ASSERT_TRUE(wait_until([] { return all_recorded(1, "process"); }));
  ASSERT_EQ(::kill(*process.pid(), SIGTERM), 0);  // not through terminate(): the child was killed
  try {
    process.join(10s);
    ADD_FAILURE() << "join returned";
  } catch (const nodal::ProcessExitedError& e) {
    EXPECT_EQ(e.signal(), SIGTERM);
    EXPECT_EQ(e.exit_code(), 0);
    EXPECT_NE(std::string(e.what()).find("SIGTERM"), std::string::npos) << e.what();
  }
  EXPECT_EQ(process.exitcode(), -SIGTERM);
}

TEST_P(ProcessTest, JoinWithATimeout) {
  if (ran_in_fresh_process(GetParam())) return;
  Process process = make(&wait_for_go, GetParam());
  process.start();
  ASSERT_TRUE(wait_until([] { return all_recorded(1, "process"); }));
  EXPECT_FALSE(process.join(0ms));
  const auto start = Clock::now();
  EXPECT_FALSE(process.join(100ms));
  EXPECT_GE(Clock::now() - start, 100ms);
  EXPECT_TRUE(process.is_alive());
  EXPECT_EQ(process.exitcode(), std::nullopt);
  std::ofstream(go_path()).close();
  EXPECT_TRUE(process.join(10s));
  EXPECT_FALSE(process.is_alive());
  EXPECT_EQ(process.exitcode(), 0);
}

TEST_P(ProcessTest, TwoChildrenAtOnce) {
  if (ran_in_fresh_process(GetParam())) return;
  Process first = make(&wait_for_go, GetParam());
  Process second = make(&record_second, GetParam());
  first.start();
  second.start();
  EXPECT_TRUE(second.join(10s)) << "the second child did not run while the first one did";
  EXPECT_TRUE(all_recorded(1, "second"));
  EXPECT_TRUE(first.is_alive());
  std::ofstream(go_path()).close();
  EXPECT_TRUE(first.join(10s));
  EXPECT_NE(*first.pid(), *second.pid());
}

TEST_P(ProcessTest, ClosuresRunUnlessForkserver) {
  if (ran_in_fresh_process(GetParam())) return;
  g_started_children = true;
  const std::string name = "closure";
  Process process([name] { record(0, name); }, {.start_method = GetParam()});
  if (GetParam() == StartMethod::forkserver) {
    try {
      process.start();
      ADD_FAILURE() << "start accepted a closure";
    } catch (const nodal::UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("plain function pointer"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(process.is_alive());
    return;
  }
  process.start();
  EXPECT_TRUE(process.join(10s));
  EXPECT_EQ(recorded(1, name), std::vector<pid_t>{*process.pid()});
}

/// Runs process_exit with the test's start method; returns its result.
nodal::testing::ChildResult run_parent(StartMethod method, const std::string& mode) {
  return nodal::testing::run({NODAL_PROCESS_EXIT, name_of(method), g_root.path.string(), mode}, 30s);
}

TEST_P(ProcessTest, AtExitDaemonsAreTerminatedAndOthersJoined) {
  const auto start = Clock::now();
  const nodal::testing::ChildResult result = run_parent(GetParam(), "exit");
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_TRUE(all_recorded(1, "worker_done")) << "the non-daemonic child was not joined at exit";
  EXPECT_GE(Clock::now() - start, 300ms);
  EXPECT_TRUE(fs::exists(record_path("daemon_terminated", 0))) << "the daemon got no SIGTERM at exit";
  for (const char* child : {"daemon", "worker"}) {
    const pid_t pid = recorded(1, child)[0];
    ASSERT_GT(pid, 0) << child << " never ran";
    EXPECT_TRUE(wait_until([pid] { return dead(pid); }, 5s)) << child << " (pid " << pid << ") outlived its parent";
  }
  EXPECT_EQ(result.err.find("not joined"), std::string::npos) << result.err;
}

TEST_P(ProcessTest, AtExitAFailureNobodyJoinedIsPrinted) {
  const nodal::testing::ChildResult result = run_parent(GetParam(), "raise");
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.err.find("nodal: not joined: process "), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("(Process-1) raised: std::runtime_error: unjoined target gave up"), std::string::npos)
      << result.err;
}

TEST_P(ProcessTest, ChildrenDieWithTheirParent) {
  nodal::testing::ChildProcess parent({NODAL_PROCESS_EXIT, name_of(GetParam()), g_root.path.string(), "hang"});
  const bool started = wait_until([] { return all_recorded(1, "hang"); });
  parent.send_signal(SIGKILL);  // no chance for the parent to stop its child itself
  parent.wait(10s);
  ASSERT_TRUE(started) << "the child never ran";
  const pid_t pid = recorded(1, "hang")[0];
  EXPECT_TRUE(wait_until([pid] { return dead(pid); }, 5s)) << "pid " << pid << " outlived its parent";
}

INSTANTIATE_TEST_SUITE_P(Methods, ProcessTest,
                         ::testing::Values(StartMethod::spawn, StartMethod::forkserver, StartMethod::fork),
                         [](const ::testing::TestParamInfo<StartMethod>& param) { return name_of(param.param); });

// ---- Names, options and misuse -----------------------------------------------------------

class ProcessFixture : public SpawnFixture {};

TEST_F(ProcessFixture, NamesCountFromOneLikePython) {
  Process first(&record_process);
  Process second(&record_process, {.name = "loader"});
  Process third(&record_process);
  const int n = std::stoi(first.name().substr(std::string("Process-").size()));
  EXPECT_EQ(first.name(), "Process-" + std::to_string(n));
  EXPECT_EQ(second.name(), "loader");
  EXPECT_EQ(third.name(), "Process-" + std::to_string(n + 2));  // named ones count too, as in Python
}

TEST_F(ProcessFixture, MisuseIsUsageError) {
  EXPECT_THROW(Process{std::function<void()>{}}, nodal::UsageError);
  Process process(&record_process, {.start_method = StartMethod::fork});
  EXPECT_THROW(process.join(), nodal::UsageError);
  EXPECT_THROW(process.terminate(), nodal::UsageError);
  EXPECT_THROW(process.kill(), nodal::UsageError);
  EXPECT_FALSE(process.daemon());
  process.set_daemon(true);
  EXPECT_TRUE(process.daemon());
  process.set_daemon(false);
  g_started_children = true;
  process.start();
  EXPECT_THROW(process.start(), nodal::UsageError);
  EXPECT_THROW(process.set_daemon(true), nodal::UsageError);
  EXPECT_TRUE(process.join(10s));
  Process moved = std::move(process);
  EXPECT_EQ(moved.exitcode(), 0);
  EXPECT_THROW(process.join(), nodal::UsageError);  // NOLINT(bugprone-use-after-move): that is the test
}

TEST_F(ProcessFixture, AStartThatFailedStartedNothing) {
  std::atomic<bool> stop{false};
  std::thread thread([&] {
    while (!stop) std::this_thread::sleep_for(1ms);
  });
  Process process(&record_process, {.start_method = StartMethod::fork});
  try {
    process.start();
    ADD_FAILURE() << "fork with a thread running was not refused";
  } catch (const nodal::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("nodal::Process::start(StartMethod::fork): the program runs 2 threads"),
              std::string::npos)
        << e.what();
  }
  stop = true;
  thread.join();
  EXPECT_FALSE(process.is_alive());
  EXPECT_EQ(process.exitcode(), std::nullopt) << "a start that threw reads as an exit";
  EXPECT_THROW(process.join(), nodal::UsageError);
  EXPECT_EQ(recorded(1, "process"), std::vector<pid_t>{-1});
}

}  // namespace
