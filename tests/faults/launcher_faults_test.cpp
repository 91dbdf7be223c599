// nodalrun when things go wrong: a rank fails, hangs, the launcher is interrupted or killed,
// or the command line is bad. Every test proves the fault happened and that nothing survived it.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "../support/child_process.hpp"
#include "../support/paths.hpp"

namespace nodal::testing {
namespace {

using namespace std::chrono_literals;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

auto has_ready_lines(std::size_t n) {
  return [n](const std::string& out, const std::string&) { return ready_pids(out).size() >= n; };
}

class RankFailure : public ::testing::TestWithParam<std::string> {};  // the start method

TEST_P(RankFailure, OneRankExitsThreeAndTheSiblingsAreStopped) {
  ChildResult r = run(nodalrun_command({"-n", "3", "--start-method", GetParam(), kRankProgram, "exit", "1", "300", "3"}));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 3);
  std::vector<pid_t> pids = ready_pids(r.out);
  ASSERT_EQ(pids.size(), 3u) << r.out;
  EXPECT_TRUE(wait_until_gone(pids, 100ms));  // nodalrun reaped them all before it exited
  EXPECT_TRUE(contains(r.err, "rank 1 (pid " + std::to_string(ready_ranks(r.out)[1]) + ") failed first")) << r.err;
  EXPECT_TRUE(contains(r.err, "exited with code 3")) << r.err;
  EXPECT_TRUE(contains(r.err, "rank 1 about to fail (exit)")) << "last stderr lines missing: " << r.err;
  EXPECT_TRUE(contains(r.err, "stopped 2 other rank(s)")) << r.err;
}

TEST_P(RankFailure, ASegfaultIsReportedAsSigsegvWithExitCode139) {
  ChildResult r = run(nodalrun_command({"-n", "2", "--start-method", GetParam(), kRankProgram, "segv", "0"}), 60s,
                      {"ASAN_OPTIONS=handle_segv=0", "UBSAN_OPTIONS=handle_segv=0"});
  EXPECT_EQ(r.exit_code, 139);
  EXPECT_TRUE(contains(r.err, "rank 0 (pid")) << r.err;
  EXPECT_TRUE(contains(r.err, "killed by SIGSEGV")) << r.err;
  EXPECT_TRUE(wait_until_gone(ready_pids(r.out), 100ms));
}

TEST_P(RankFailure, AnUncaughtExceptionIsInTheReportWithItsStack) {
  ChildResult r = run(nodalrun_command({"-n", "2", "--start-method", GetParam(), kRankProgram, "throw", "1"}));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(contains(r.err, "rank 1 raised std::runtime_error: rank 1 gave up: the flux capacitor is empty")) << r.err;
  EXPECT_TRUE(contains(r.err, "main")) << "no stack trace in the report: " << r.err;
  EXPECT_TRUE(wait_until_gone(ready_pids(r.out), 100ms));
}

INSTANTIATE_TEST_SUITE_P(StartMethods, RankFailure, ::testing::Values("spawn", "forkserver"));

TEST(Timeout, AHungJobEndsWith124AndRanksIgnoringSigtermAreKilled) {
  auto start = std::chrono::steady_clock::now();
  ChildResult r = run(nodalrun_command({"-n", "2", "--timeout", "1", "--grace", "0.5", kRankProgram, "hang_ignore_term"}));
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.exit_code, 124);
  EXPECT_TRUE(contains(r.err, "the job passed --timeout 1 s")) << r.err;
  EXPECT_TRUE(contains(r.err, "SIGKILL for 2")) << r.err;
  EXPECT_GE(seconds, 1.4);
  EXPECT_LT(seconds, 10.0);
  EXPECT_TRUE(wait_until_gone(ready_pids(r.out), 100ms));
}

TEST(Signals, SigintIsForwardedAndTheJobEndsWith130) {
  ChildProcess launcher(nodalrun_command({"-n", "3", kRankProgram, "hang"}));
  ASSERT_TRUE(launcher.wait_for_output(has_ready_lines(3), 30s));
  launcher.send_signal(SIGINT);
  ChildResult r = launcher.wait(30s);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 130);
  EXPECT_TRUE(contains(r.err, "received SIGINT")) << r.err;
  EXPECT_TRUE(contains(r.err, "killed by SIGINT")) << r.err;  // the ranks died of the forwarded signal
  EXPECT_TRUE(wait_until_gone(ready_pids(r.out), 100ms));
}

TEST(Signals, ASecondSigintKillsRanksThatIgnoreTheFirst) {
  ChildProcess launcher(nodalrun_command({"-n", "2", "--grace", "60", kRankProgram, "hang_ignore_all"}));
  ASSERT_TRUE(launcher.wait_for_output(has_ready_lines(2), 30s));
  std::vector<pid_t> pids = ready_pids(launcher.out());
  launcher.send_signal(SIGINT);  // forwarded and ignored; the 60 s grace would keep them running
  launcher.wait_for_output([](const std::string&, const std::string&) { return false; }, 300ms);
  for (pid_t pid : pids) EXPECT_TRUE(process_exists(pid, false)) << "the ranks ignore SIGINT";
  auto start = std::chrono::steady_clock::now();
  launcher.send_signal(SIGINT);
  ChildResult r = launcher.wait(30s);
  ASSERT_FALSE(r.timed_out);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s) << "waited for the grace instead of killing";
  EXPECT_EQ(r.exit_code, 130);
  EXPECT_TRUE(contains(r.err, "second SIGINT: killing every rank now")) << r.err;
  EXPECT_TRUE(wait_until_gone(pids, 100ms));
}

TEST(Signals, SigusrIsForwardedToEveryRank) {
  ChildProcess launcher(nodalrun_command({"-n", "3", kRankProgram, "wait_usr1"}));
  ASSERT_TRUE(launcher.wait_for_output(has_ready_lines(3), 30s));
  launcher.send_signal(SIGUSR1);
  ChildResult r = launcher.wait(30s);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  for (int rank : {0, 1, 2}) {
    EXPECT_TRUE(contains(r.out, "[" + std::to_string(rank) + "] rank " + std::to_string(rank) + " got SIGUSR1")) << r.out;
  }
}

class LauncherKilled : public ::testing::TestWithParam<std::string> {};

TEST_P(LauncherKilled, NoRankSurvivesSigkillOfTheLauncher) {
  ChildProcess launcher(nodalrun_command({"-n", "4", "--start-method", GetParam(), kRankProgram, "hang_ignore_term"}));
  ASSERT_TRUE(launcher.wait_for_output(has_ready_lines(4), 30s));
  std::vector<pid_t> pids = ready_pids(launcher.out());
  ASSERT_EQ(pids.size(), 4u);
  for (pid_t pid : pids) ASSERT_TRUE(process_exists(pid, false)) << pid;
  launcher.send_signal(SIGKILL);
  ChildResult r = launcher.wait(10s);
  EXPECT_EQ(r.exit_code, 128 + SIGKILL);
  // Orphans go to init, which may reap them late here: a zombie runs nothing, so it counts as gone.
  EXPECT_TRUE(wait_until_gone(pids, 5s, /*count_zombies=*/false)) << "a rank outlived its launcher";
}

INSTANTIATE_TEST_SUITE_P(StartMethods, LauncherKilled, ::testing::Values("spawn", "forkserver"));

/// A memory cgroup of the test's own with a small limit and no swap; removed on destruction.
class MemoryCgroup {
 public:
  explicit MemoryCgroup(long limit_bytes) {
    namespace fs = std::filesystem;
    std::string name = "nodal-oom-test-" + std::to_string(::getpid());
    if (fs::exists("/sys/fs/cgroup/cgroup.controllers")) {  // v2
      dir_ = "/sys/fs/cgroup/" + name;
      if (!make() || !write("memory.max", limit_bytes)) return;
      write("memory.swap.max", 0);
    } else {  // v1
      dir_ = "/sys/fs/cgroup/memory/" + name;
      if (!make() || !write("memory.limit_in_bytes", limit_bytes)) return;
      write("memory.memsw.limit_in_bytes", limit_bytes);  // absent without swap accounting: fine
      write("memory.swappiness", 0);
    }
    usable_ = true;
  }
  ~MemoryCgroup() {
    if (!dir_.empty()) ::rmdir(dir_.c_str());
  }
  bool usable() const { return usable_; }
  const std::string& dir() const { return dir_; }

 private:
  bool make() { return ::mkdir(dir_.c_str(), 0755) == 0 || errno == EEXIST; }
  bool write(const std::string& file, long value) {
    std::ofstream out(dir_ + "/" + file);
    out << value;
    out.flush();
    return static_cast<bool>(out);
  }
  std::string dir_;
  bool usable_ = false;
};

TEST(Oom, ARankKilledByTheOomKillerIsNamedInTheReport) {
  MemoryCgroup cgroup(128L << 20);
  if (!cgroup.usable()) GTEST_SKIP() << "no writable memory cgroup here (needs root and cgroupfs): " << cgroup.dir();
  // Enter the cgroup before exec, so nodalrun and its ranks are all inside it.
  std::string script = "echo $$ > " + cgroup.dir() + "/cgroup.procs && exec \"$@\"";
  std::vector<std::string> command = {"/bin/sh", "-c", script, "sh", kNodalrun, "-n", "2", kRankProgram, "eat_memory", "1"};
  ChildResult r = run(command, 120s, {"ASAN_OPTIONS=allocator_may_return_null=1"});
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r.err;
  EXPECT_TRUE(contains(r.err, "rank 1 (pid")) << r.err;
  EXPECT_TRUE(contains(r.err, "killed by SIGKILL")) << r.err;
  EXPECT_TRUE(contains(r.err, "killed by the OOM killer")) << r.err;
  EXPECT_TRUE(wait_until_gone(ready_pids(r.out), 1s));
}

TEST(BadInput, ClearErrorsAndNoRankStarted) {
  std::string marker = (std::filesystem::temp_directory_path() / ("nodal-marker-" + std::to_string(::getpid()))).string();
  std::filesystem::remove(marker);
  std::string not_executable = marker + ".txt";
  std::ofstream(not_executable) << "plain text\n";
  std::filesystem::permissions(not_executable, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  struct Case {
    std::vector<std::string> args;
    int code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"-n", "0", "/usr/bin/touch", marker}, 2, "-n 0: expected a number of ranks from 1 to 1024"},
      {{"-n", "5000", "/usr/bin/touch", marker}, 2, "-n 5000: expected a number of ranks from 1 to 1024"},
      {{"-n", "two", "/usr/bin/touch", marker}, 2, "-n two: expected"},
      {{"--bogus", "-n", "2", "/usr/bin/touch", marker}, 2, "unknown option --bogus"},
      {{"-n", "2", "--start-method", "teleport", "/usr/bin/touch", marker}, 2,
       "--start-method teleport: expected spawn or forkserver"},
      {{"-n", "2", "--timeout", "-1", "/usr/bin/touch", marker}, 2, "--timeout -1: expected a number of seconds > 0"},
      {{"-n", "2"}, 2, "no PROGRAM given"},
      {{"/usr/bin/touch", marker}, 2, "-n is required"},
      {{"-n", "2", "/no/such/program", marker}, 127, "/no/such/program: no such file"},
      {{"-n", "2", "no-such-program-anywhere"}, 127, "no-such-program-anywhere: command not found"},
      {{"-n", "2", not_executable}, 126, not_executable + ": not executable"},
  };
  for (const Case& c : cases) {
    ChildResult r = run(nodalrun_command(c.args));
    EXPECT_EQ(r.exit_code, c.code) << c.args[0] << " ... " << r.err;
    EXPECT_TRUE(contains(r.err, c.message)) << r.err;
    EXPECT_EQ(lines_of(r.err).size(), 1u) << "one clear line, got: " << r.err;
    EXPECT_EQ(r.out, "");
    EXPECT_FALSE(std::filesystem::exists(marker)) << "a rank was started for: " << r.err;
  }
  std::filesystem::remove(not_executable);
}

}  // namespace
}  // namespace nodal::testing
