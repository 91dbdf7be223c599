// nodalrun end to end: real ranks, real output, real environment.
#include <gtest/gtest.h>

#include <boost/json/src.hpp>

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "../support/child_process.hpp"
#include "../support/paths.hpp"

namespace nodal::testing {
namespace {

using namespace std::chrono_literals;

std::map<int, std::map<std::string, std::string>> env_by_rank(const std::string& out) {
  std::map<int, std::map<std::string, std::string>> result;
  std::regex pattern(R"(^\[(\d+)\] ([A-Za-z_]+)=(.*)$)");
  for (const std::string& line : lines_of(out)) {
    std::smatch m;
    if (std::regex_match(line, m, pattern)) result[std::stoi(m[1])][m[2]] = m[3];
  }
  return result;
}

std::string temp_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / (name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

TEST(Launcher, NormalRunTagsEveryRankAndExitsZero) {
  ChildResult r = run(nodalrun_command({"-n", "4", kRankProgram, "ok"}));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::set<int> seen;
  std::regex pattern(R"(^\[(\d)\] rank (\d) of 4 local (\d)/4 job nodal-\d+-[0-9a-f]+$)");
  for (const std::string& line : lines_of(r.out)) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, pattern)) << line;
    EXPECT_EQ(m[1], m[2]);  // the tag is the rank that wrote the line
    EXPECT_EQ(m[2], m[3]);
    seen.insert(std::stoi(m[1]));
  }
  EXPECT_EQ(seen, (std::set<int>{0, 1, 2, 3}));
  EXPECT_EQ(r.err, "");  // no report for a clean run
}

TEST(Launcher, EnvironmentFollowsTorchrunAndPassesExports) {
  ChildResult r = run(nodalrun_command({"-n", "2", "-x", "EXTRA_A=apple", "-x", "EXTRA_B", kRankProgram, "env"}),
                      60s, {"EXTRA_B=from-the-launcher"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto env = env_by_rank(r.out);
  ASSERT_EQ(env.size(), 2u);
  for (int rank : {0, 1}) {
    EXPECT_EQ(env[rank]["RANK"], std::to_string(rank));
    EXPECT_EQ(env[rank]["LOCAL_RANK"], std::to_string(rank));
    EXPECT_EQ(env[rank]["WORLD_SIZE"], "2");
    EXPECT_EQ(env[rank]["LOCAL_WORLD_SIZE"], "2");
    EXPECT_EQ(env[rank]["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ(env[rank]["EXTRA_A"], "apple");
    EXPECT_EQ(env[rank]["EXTRA_B"], "from-the-launcher");
    int port = std::stoi(env[rank]["MASTER_PORT"]);
    EXPECT_GT(port, 0);
    EXPECT_LT(port, 65536);
  }
  EXPECT_EQ(env[0]["MASTER_PORT"], env[1]["MASTER_PORT"]);
  EXPECT_EQ(env[0]["NODAL_JOB_ID"], env[1]["NODAL_JOB_ID"]);
}

TEST(Launcher, TheNodeIsCrowdedWhenRanksOutnumberItsCores) {
  // NODAL_CROWDED: 0 for one rank; without binding, 0 for as many ranks as the CPUs nodalrun may
  // use (this process's, which nodalrun inherits) and 1 for one more; -x overrides it.
  auto crowded_of = [](const std::vector<std::string>& args, const std::string& rank = "0") {
    ChildResult r = run(nodalrun_command(args), 60s);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return env_by_rank(r.out)[std::stoi(rank)]["NODAL_CROWDED"];
  };
  EXPECT_EQ(crowded_of({"-n", "1", kRankProgram, "env"}), "0");
  cpu_set_t set;
  const int cpus = ::sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  EXPECT_EQ(crowded_of({"-n", std::to_string(cpus + 1), "--bind-to", "none", kRankProgram, "env"}), "1")
      << cpus + 1 << " ranks, " << cpus << " CPUs";
  EXPECT_EQ(crowded_of({"-n", std::to_string(cpus), "--bind-to", "none", kRankProgram, "env"}), "0")
      << cpus << " ranks, " << cpus << " CPUs";
  EXPECT_EQ(crowded_of({"-n", "1", "-x", "NODAL_CROWDED=1", kRankProgram, "env"}), "1");
}

TEST(Launcher, BindsRanksToCoresOnlyWhenAskedOrWhileTheyFit) {
  long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
  auto cpus_of_rank0 = [](const std::vector<std::string>& args) {
    ChildResult r = run(nodalrun_command(args));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::string value = env_by_rank(r.out)[0]["cpus"];
    return value.empty() ? -1 : std::stoi(value);
  };
  // Bound: one core (one CPU, or its hyperthreads), never the whole machine.
  int bound = cpus_of_rank0({"-n", "1", "--bind-to", "core", kRankProgram, "env"});
  ASSERT_GT(bound, 0);
  if (cpus > 1) {
    EXPECT_LT(bound, cpus);
  }
  // The default binds while ranks <= cores, with either start method ...
  if (cpus > 1) {
    EXPECT_LT(cpus_of_rank0({"-n", "1", kRankProgram, "env"}), cpus);
    EXPECT_LT(cpus_of_rank0({"-n", "1", "--start-method", "forkserver", kRankProgram, "env"}), cpus);
  }
  // ... and leaves oversubscribed ranks free, like an explicit none.
  EXPECT_EQ(cpus_of_rank0({"-n", std::to_string(2 * cpus + 1), kRankProgram, "env"}), cpus);
  EXPECT_EQ(cpus_of_rank0({"-n", "1", "--bind-to", "none", kRankProgram, "env"}), cpus);
}

TEST(Launcher, HeavyOutputIsNeverInterleavedWithinALine) {
  const int ranks = 8, lines = 3000;
  ChildResult r = run(nodalrun_command({"-n", std::to_string(ranks), kRankProgram, "spam", std::to_string(lines)}),
                      120s);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::regex pattern(R"(^\[(\d+)\] line (\d+):(\d+):([a-z]*)$)");
  std::map<int, int> next_index;
  for (const std::string& line : lines_of(r.out)) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, pattern)) << "mixed or broken line: " << line;
    int tag = std::stoi(m[1]), rank = std::stoi(m[2]), index = std::stoi(m[3]);
    ASSERT_EQ(tag, rank) << line;
    ASSERT_EQ(index, next_index[rank]) << "lines of rank " << rank << " lost or reordered";
    ASSERT_EQ(m[4].length(), static_cast<std::size_t>(index % 97)) << line;
    ++next_index[rank];
  }
  ASSERT_EQ(next_index.size(), static_cast<std::size_t>(ranks));
  for (auto [rank, count] : next_index) EXPECT_EQ(count, lines) << "rank " << rank;
}

TEST(Launcher, OutputDirHoldsEachRanksUntaggedStreams) {
  std::string dir = temp_dir("nodal-outdir");
  // Rank 1 fails 500 ms in, after rank 0 has surely written its first line even under ASan.
  ChildResult r = run(nodalrun_command({"-n", "2", "--output-dir", dir, kRankProgram, "exit", "1", "500", "5"}));
  EXPECT_EQ(r.exit_code, 5);
  for (int rank : {0, 1}) {
    std::ifstream out(dir + "/rank." + std::to_string(rank) + ".stdout");
    std::string line;
    ASSERT_TRUE(std::getline(out, line)) << "rank " << rank;
    EXPECT_EQ(line.rfind("ready " + std::to_string(rank) + " ", 0), 0u) << line;
  }
  std::ifstream err(dir + "/rank.1.stderr");
  std::stringstream content;
  content << err.rdbuf();
  EXPECT_EQ(content.str(), "rank 1 about to fail (exit)\n");
  std::filesystem::remove_all(dir);
}

TEST(Launcher, SixtyFourRanksOnTwoCores) {
  ChildResult r = run(nodalrun_command({"-n", "64", kRankProgram, "ok"}), 120s);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::set<std::string> tags;
  for (const std::string& line : lines_of(r.out)) tags.insert(line.substr(0, line.find(']') + 1));
  EXPECT_EQ(tags.size(), 64u);
  EXPECT_EQ(lines_of(r.out).size(), 64u);
}

TEST(Launcher, ReportFileHasPerRankWallTimeAndPeakRss) {
  std::string dir = temp_dir("nodal-report");
  std::string path = dir + "/report.json";
  ChildResult r = run(nodalrun_command({"-n", "3", "--report", path, kRankProgram, "ok"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  boost::json::value report = boost::json::parse(text.str());
  EXPECT_EQ(report.at("exit_code").as_int64(), 0);
  EXPECT_EQ(report.at("world_size").as_int64(), 3);
  EXPECT_TRUE(report.at("failure").is_null());
  const auto& ranks = report.at("ranks").as_array();
  ASSERT_EQ(ranks.size(), 3u);
  for (const auto& rank : ranks) {
    EXPECT_EQ(rank.at("exit_code").as_int64(), 0);
    EXPECT_GT(rank.at("peak_rss_kib").as_int64(), 100);  // a C++ process touches more than 100 KiB
    EXPECT_GT(rank.at("wall_time_s").as_double(), 0.0);
    EXPECT_LT(rank.at("wall_time_s").as_double(), 60.0);
  }
  std::filesystem::remove_all(dir);
}

/// GPUs the NVIDIA driver lists (0 without one): nodalrun checks --gpus indices against it.
int driver_gpus() {
  std::error_code error;
  int count = 0;
  for (std::filesystem::directory_iterator it("/proc/driver/nvidia/gpus", error), end; !error && it != end;
       it.increment(error)) {
    ++count;
  }
  return count;
}

// No GPU is touched: these check the environment and the device each rank is given. `--gpus all`
// takes nodalrun's CUDA_VISIBLE_DEVICES as it is, so they run on a machine without a GPU too.
TEST(Gpus, EveryRankSeesTheListAndGetsItsOwnDevice) {
  for (const std::string method : {"spawn", "forkserver"}) {
    ChildResult r = run(nodalrun_command({"--gpus", "all", "-n", "4", "--ranks-per-gpu", "2", "--start-method", method,
                                          kRankProgram, "gpu"}),
                        60s, {"CUDA_VISIBLE_DEVICES=0,1", "NODAL_DEVICE=5", "CUDA_DEVICE_ORDER=FASTEST_FIRST"});
    ASSERT_EQ(r.exit_code, 0) << method << ": " << r.err;
    auto env = env_by_rank(r.out);
    ASSERT_EQ(env.size(), 4u) << r.out;
    for (int rank = 0; rank < 4; ++rank) {
      EXPECT_EQ(env[rank]["CUDA_VISIBLE_DEVICES"], "0,1") << method;
      EXPECT_EQ(env[rank]["CUDA_DEVICE_ORDER"], "PCI_BUS_ID") << method;         // /proc's numbering
      EXPECT_EQ(env[rank]["NODAL_DEVICE"], std::to_string(rank / 2)) << method;  // not nodalrun's 5
      EXPECT_EQ(env[rank]["NODAL_FORKSERVER_DEVICES"], "<unset>") << method;
      EXPECT_EQ(env[rank]["device"], "cuda:" + std::to_string(rank / 2)) << method;
    }
  }
}

TEST(Gpus, AListReplacesNodalrunsCudaVisibleDevices) {
  if (driver_gpus() == 0) GTEST_SKIP() << "--gpus 0 needs a GPU in /proc/driver/nvidia/gpus";
  ChildResult r = run(nodalrun_command({"--gpus", "0", "-n", "2", "--ranks-per-gpu", "2", kRankProgram, "gpu"}), 60s,
                      {"CUDA_VISIBLE_DEVICES=7"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto env = env_by_rank(r.out);
  for (int rank : {0, 1}) {
    EXPECT_EQ(env[rank]["CUDA_VISIBLE_DEVICES"], "0");
    EXPECT_EQ(env[rank]["NODAL_DEVICE"], "0");
  }
}

TEST(Gpus, AListNamingAGpuThatIsNotThereExitsTwo) {
  if (driver_gpus() >= 6) GTEST_SKIP() << "this machine has a GPU 5";
  ChildResult r = run(nodalrun_command({"--gpus", "5", "-n", "1", "true"}));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  const std::string found = driver_gpus() == 0
                                ? "found no GPU: /proc/driver/nvidia/gpus is empty or missing"
                                : "found " + std::to_string(driver_gpus()) + " GPU";  // then s, where, which
  EXPECT_EQ(r.err.rfind("nodalrun: --gpus 5: no GPU 5 on this machine (" + found, 0), 0u) << r.err;
  EXPECT_EQ(lines_of(r.err).size(), 1u) << r.err;
  EXPECT_EQ(r.out, "");
}

TEST(Gpus, WithoutGpusRanksKeepNodalrunsEnvironmentAndTheCpu) {
  ChildResult r = run(nodalrun_command({"-n", "2", kRankProgram, "gpu"}), 60s,
                      {"CUDA_VISIBLE_DEVICES=3", "CUDA_DEVICE_ORDER=FASTEST_FIRST"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto env = env_by_rank(r.out);
  for (int rank : {0, 1}) {
    EXPECT_EQ(env[rank]["CUDA_VISIBLE_DEVICES"], "3");
    EXPECT_EQ(env[rank]["CUDA_DEVICE_ORDER"], "FASTEST_FIRST");
    EXPECT_EQ(env[rank]["NODAL_DEVICE"], "<unset>");
    EXPECT_EQ(env[rank]["device"], "cpu");
  }
}

TEST(Gpus, ImpossibleLayoutsExitTwoWithOneLine) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--gpus", "all", "-n", "8"},  // all: CUDA_VISIBLE_DEVICES=0,1 below
       "nodalrun: -n 8 ranks on 2 GPUs with --ranks-per-gpu 1: at most 2 ranks fit; raise --ranks-per-gpu to 4 or "
       "give more GPUs (see nodalrun --help)\n"},
      {{"--gpus", "0,0", "-n", "1"}, "nodalrun: --gpus 0,0: GPU 0 is listed twice (see nodalrun --help)\n"},
      {{"--ranks-per-gpu", "2", "-n", "1"}, "nodalrun: --ranks-per-gpu needs --gpus (see nodalrun --help)\n"},
  };
  for (const auto& [args, message] : cases) {
    std::vector<std::string> command = args;
    command.insert(command.end(), {kRankProgram, "gpu"});
    ChildResult r = run(nodalrun_command(command), 60s, {"CUDA_VISIBLE_DEVICES=0,1"});
    EXPECT_EQ(r.exit_code, 2) << message;
    EXPECT_EQ(r.err, message);
    EXPECT_EQ(r.out, "");  // no rank started
  }
}

TEST(Gpus, RankRefusesAMalformedNodalDevice) {
  ChildResult r = run({kRankProgram, "gpu"}, 60s, {"NODAL_DEVICE=first"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("NODAL_DEVICE='first' is not a non-negative integer"), std::string::npos) << r.err;
}

// --mps against tests/support/fake_mps/nvidia-cuda-mps-control, which keeps the real program's
// interface (-d; get_server_list and quit on stdin) and records what it was asked.
struct FakeMps {
  std::string dir = temp_dir("nodal-fake-mps");
  std::string record = dir + "/record";
  std::vector<std::string> env(bool fail = false) const {
    return {std::string("PATH=") + NODAL_TEST_FAKE_MPS_DIR + ":" + std::getenv("PATH"), "FAKE_MPS_RECORD=" + record,
            "TMPDIR=" + dir, "CUDA_VISIBLE_DEVICES=3,5", std::string("FAKE_MPS_FAIL=") + (fail ? "1" : "0"),
            "CUDA_MPS_PIPE_DIRECTORY=/nonexistent/nodalrun-must-replace-this"};
  }
  std::vector<std::string> lines() const {
    std::ifstream in(record);
    std::vector<std::string> out;
    for (std::string line; std::getline(in, line);) out.push_back(line);
    return out;
  }
  /// The job's daemon directories under TMPDIR (nodal-mps-*).
  std::vector<std::string> job_dirs() const {
    std::vector<std::string> out;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      if (entry.path().filename().string().starts_with("nodal-mps-")) out.push_back(entry.path().string());
    }
    return out;
  }
  pid_t daemon_pid() const {
    for (const std::string& line : lines()) {
      if (line.starts_with("daemon ")) return std::stoi(line.substr(7));
    }
    return -1;
  }
  ~FakeMps() { std::filesystem::remove_all(dir); }
};

TEST(Gpus, MpsStartsADaemonOfTheJobGivesItToEveryRankAndStopsIt) {
  FakeMps mps;
  ChildResult r = run(nodalrun_command({"--gpus", "all", "--mps", "-n", "4", "--ranks-per-gpu", "2", kRankProgram, "gpu"}),
                      60s, mps.env());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<std::string> lines = mps.lines();
  ASSERT_GE(lines.size(), 3u) << r.err;
  static const std::regex start(R"(^start pipe=(\S+/nodal-mps-\w+)/pipe log=(\S+)/log visible=3,5 order=PCI_BUS_ID$)");
  std::smatch m;
  ASSERT_TRUE(std::regex_match(lines[0], m, start)) << lines[0];
  const std::string job_dir = m[1];
  EXPECT_EQ(m[2], job_dir);
  EXPECT_EQ(job_dir.rfind(mps.dir, 0), 0u) << "under TMPDIR: " << job_dir;
  auto env = env_by_rank(r.out);
  ASSERT_EQ(env.size(), 4u) << r.out;
  for (int rank = 0; rank < 4; ++rank) {  // nodalrun's own CUDA_MPS_PIPE_DIRECTORY is replaced
    EXPECT_EQ(env[rank]["CUDA_MPS_PIPE_DIRECTORY"], job_dir + "/pipe") << rank;
    EXPECT_EQ(env[rank]["CUDA_MPS_LOG_DIRECTORY"], job_dir + "/log") << rank;
    // The MPS server shows the daemon's GPUs 3 and 5 to its clients as 0 and 1.
    EXPECT_EQ(env[rank]["CUDA_VISIBLE_DEVICES"], "0,1") << rank;
    EXPECT_EQ(env[rank]["NODAL_DEVICE"], std::to_string(rank / 2)) << rank;
  }
  // The daemon answered only after it started (0.3 s): nodalrun waited for it.
  EXPECT_NE(std::find(lines.begin(), lines.end(), "get_server_list: no daemon yet"), lines.end());
  EXPECT_EQ(lines.back(), "quit pipe=" + job_dir + "/pipe");
  EXPECT_TRUE(mps.job_dirs().empty()) << "the job's MPS directory is removed";
  // The guard waited for the daemon (its pid file) before nodalrun returned.
  EXPECT_FALSE(process_exists(mps.daemon_pid(), false)) << "the daemon stopped";
}

TEST(Gpus, MpsDaemonStopsWhenNodalrunIsKilled) {
  FakeMps mps;
  ChildProcess job(nodalrun_command({"--gpus", "all", "--mps", "-n", "2", "--ranks-per-gpu", "2", kRankProgram, "hang"}),
                   mps.env());
  ASSERT_TRUE(job.wait_for_output([](const std::string& out, const std::string&) { return ready_ranks(out).size() == 2; },
                                  20s))
      << job.out();
  const pid_t daemon = mps.daemon_pid();
  ASSERT_GT(daemon, 0);
  ASSERT_TRUE(process_exists(daemon, false));
  job.send_signal(SIGKILL);
  job.wait(10s);
  EXPECT_TRUE(wait_until_gone({daemon}, 10s)) << "the guard sent quit";
  for (int i = 0; i < 100 && !mps.job_dirs().empty(); ++i) std::this_thread::sleep_for(50ms);
  EXPECT_TRUE(mps.job_dirs().empty());
  EXPECT_TRUE(mps.lines().back().starts_with("quit ")) << mps.lines().back();
}

TEST(Gpus, MpsThatCannotStartFailsTheJobSayingWhyAndLeavesNothing) {
  FakeMps mps;
  ChildResult r = run(nodalrun_command({"--gpus", "all", "--mps", "-n", "2", "--ranks-per-gpu", "2", kRankProgram, "gpu"}),
                      60s, mps.env(/*fail=*/true));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("--mps: `" NODAL_TEST_FAKE_MPS_DIR "/nvidia-cuda-mps-control -d` exited with code 1"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("fake MPS: cannot start: no device supports MPS"), std::string::npos) << r.err;
  EXPECT_EQ(count_lines(r.out, "CUDA_VISIBLE_DEVICES="), 0) << "no rank ran: " << r.out;
  for (int i = 0; i < 100 && !mps.job_dirs().empty(); ++i) std::this_thread::sleep_for(50ms);
  EXPECT_TRUE(mps.job_dirs().empty());
}

TEST(Gpus, MpsWithoutTheControlProgramOrWithoutGpusIsAUsageError) {
  FakeMps mps;
  ChildResult missing = run(nodalrun_command({"--gpus", "all", "--mps", "-n", "2", "--ranks-per-gpu", "2", kRankProgram, "gpu"}),
                            60s, {"PATH=" + mps.dir, "CUDA_VISIBLE_DEVICES=3,5", "TMPDIR=" + mps.dir});
  EXPECT_EQ(missing.exit_code, 2) << missing.err;
  EXPECT_NE(missing.err.find("--mps: nvidia-cuda-mps-control: command not found on PATH (it comes with the NVIDIA driver)"),
            std::string::npos)
      << missing.err;
  EXPECT_TRUE(mps.job_dirs().empty());
  ChildResult no_gpus = run(nodalrun_command({"--mps", "-n", "2", kRankProgram, "gpu"}));
  EXPECT_EQ(no_gpus.exit_code, 2);
  EXPECT_NE(no_gpus.err.find("--mps needs --gpus"), std::string::npos) << no_gpus.err;
}

TEST(Launcher, VerboseSaysWhatTheSetUpDidAndHowLongItTook) {
  for (const char* method : {"spawn", "forkserver"}) {
    ChildResult r = run(nodalrun_command({"-n", "2", "--verbose", "--start-method", method, kRankProgram, "ok"}));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(count_lines(r.err, R"(^nodalrun: set-up: arena of at most 1 GiB created \(memfd\), with the wait table of 2 ranks in [\d.]+ ms$)"), 1) << r.err;
    EXPECT_EQ(count_lines(r.err, R"(^nodalrun: set-up: placement .* in [\d.]+ ms$)"), 1) << r.err;
    // Each rank's own set-up, through NODAL_VERBOSE.
    EXPECT_EQ(count_lines(r.err, R"(^\[[01]\] nodal: rank [01]: nodal::init \(rank [01] of 2, arena attached\) in [\d.]+ ms$)"), 2)
        << r.err;
    if (std::string(method) == "forkserver") {
      EXPECT_EQ(count_lines(r.err, R"(^nodalrun: set-up: forkserver zygote loaded the program and reached nodal::init)"), 1)
          << r.err;
    } else {
      EXPECT_EQ(count_lines(r.err, R"(^nodalrun: set-up: 2 ranks started \(fork\+exec\) in [\d.]+ ms$)"), 1) << r.err;
    }
  }
  ChildResult quiet = run(nodalrun_command({"-n", "2", kRankProgram, "ok"}));
  EXPECT_EQ(quiet.err, "") << "set-up lines without --verbose";
}

TEST(Forkserver, RanksReturnFromInitWithTheirRank) {
  ChildResult r = run(nodalrun_command({"-n", "4", "--start-method", "forkserver", kRankProgram, "ok"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::regex pattern(R"(^\[(\d)\] rank (\d) of 4 local (\d)/4 job .*$)");
  std::set<int> seen;
  for (const std::string& line : lines_of(r.out)) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, pattern)) << line;
    EXPECT_EQ(m[1], m[2]);
    seen.insert(std::stoi(m[1]));
  }
  EXPECT_EQ(seen.size(), 4u);
}

TEST(Forkserver, SharesWhatTheZygoteLoaded) {
  for (const std::string method : {"forkserver", "spawn"}) {
    std::string dir = temp_dir("nodal-zygote");
    std::string log = dir + "/load.log";
    ChildResult r = run(nodalrun_command({"-n", "3", "--start-method", method, kRankProgram, "zygote_load", log}));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::regex pattern(R"(^\[(\d)\] rank \d table (0x[0-9a-f]+) sum (\d+) shared_kib (\d+)$)");
    std::set<std::string> sums;
    int ranks = 0;
    for (const std::string& line : lines_of(r.out)) {
      std::smatch m;
      ASSERT_TRUE(std::regex_match(line, m, pattern)) << line;
      sums.insert(m[3]);
      long shared_kib = std::stol(m[4]);
      // forkserver: the 32 MiB table is one copy mapped by every rank; spawn: each built its own.
      if (method == "forkserver") {
        EXPECT_GE(shared_kib, 32 * 1024) << line;
      } else {
        EXPECT_LT(shared_kib, 1024) << line;
      }
      ++ranks;
    }
    EXPECT_EQ(ranks, 3);
    EXPECT_EQ(sums.size(), 1u);
    EXPECT_EQ(lines_of(r.out).size(), 3u);
    std::ifstream file(log);
    std::stringstream text;
    text << file.rdbuf();
    EXPECT_EQ(lines_of(text.str()).size(), method == "forkserver" ? 1u : 3u) << text.str();
    std::filesystem::remove_all(dir);
  }
}

TEST(Forkserver, RefusesAZygoteThatRunsThreads) {
  ChildResult r = run(nodalrun_command({"-n", "2", "--start-method", "forkserver", kRankProgram, "threads_before_init"}));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("runs 2 threads when it calls nodal::init()"), std::string::npos) << r.err;
}

TEST(Forkserver, RefusesAProgramThatNeverCallsInit) {
  ChildResult r = run(nodalrun_command({"-n", "2", "--start-method", "forkserver", kRankProgram, "no_init"}));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("exited without calling nodal::init()"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace nodal::testing
