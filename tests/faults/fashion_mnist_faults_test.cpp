// The Fashion-MNIST job's failure drill: one process crashes mid-training; nodalrun must name it,
// exit with its code, and leave no process and no shared memory behind.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "../support/child_process.hpp"
#include "../support/fashion_mnist.hpp"
#include "../support/paths.hpp"

namespace nodal::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// Processes whose command line mentions `text` (the job's ranks and their loader children carry
/// the test's own directory in their arguments). Zombies have no command line and do not count.
std::vector<pid_t> processes_mentioning(const std::string& text) {
  std::vector<pid_t> found;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "cmdline", std::ios::binary);
    const std::string cmdline{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    if (contains(cmdline, text) && std::stoi(name) != ::getpid()) found.push_back(std::stoi(name));
  }
  return found;
}

class FailureDrill : public ::testing::TestWithParam<std::string> {  // who crashes: trainer or loader
 protected:
  void SetUp() override {
    if (!have_fashion_mnist_data()) {
      GTEST_SKIP() << kFashionMnistData << " is missing: install dataset-fashion-mnist (scripts/setup-debian.sh)";
    }
    fs::create_directory(dir_ / "shm");
  }
  TempDir dir_{"nodal-fashion-mnist-drill"};
};

TEST_P(FailureDrill, TheCrashIsReportedAndNothingIsLeftBehind) {
  // A named arena in the test's directory (file_system strategy) shows whether shared memory is left.
  ChildResult r = run(nodalrun_command({"-n",
                                        "2",
                                        "--shm-strategy",
                                        "file_system",
                                        "--shm-dir",
                                        dir_ / "shm",
                                        kFashionMnist,
                                        "--train-subset",
                                        "4096",
                                        "--epochs",
                                        "1",
                                        "--test-subset",
                                        "500",
                                        "--fail-at-step",
                                        "5",
                                        "--fail-rank",
                                        "1",
                                        "--fail-in",
                                        GetParam(),
                                        "--dump-weights",
                                        dir_ / "weights"}),
                      120s);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(contains(r.out, "[0] fashion_mnist: 2 trainer(s)")) << "training never started: " << r.out;
  EXPECT_FALSE(contains(r.out, "summary:")) << "training finished despite the crash: " << r.out;
  EXPECT_FALSE(fs::exists(dir_ / "weights"));
  EXPECT_TRUE(contains(r.err, "nodalrun: rank 1 (pid")) << r.err;
  EXPECT_TRUE(contains(r.err, ") failed first")) << r.err;
  if (GetParam() == "trainer") {
    EXPECT_TRUE(contains(r.err, "std::runtime_error: failure drill: trainer rank 1 crashes at step 5")) << r.err;
  } else {
    // The loader is a nodal::spawn child of trainer 1, which fails with the child's error.
    EXPECT_TRUE(contains(r.err, "nodal::ProcessRaisedError")) << r.err;
    EXPECT_TRUE(contains(r.err, "failure drill: loader 0 of trainer 1 crashes at step 5")) << r.err;
  }
  EXPECT_TRUE(contains(r.err, "stopped 1 other rank(s)")) << r.err;

  std::vector<pid_t> left = processes_mentioning(dir_.path());
  for (int i = 0; i < 100 && !left.empty(); ++i) {
    std::this_thread::sleep_for(20ms);
    left = processes_mentioning(dir_.path());
  }
  EXPECT_TRUE(left.empty()) << left.size() << " process(es) of the job survived it, first pid " << left.front();
  EXPECT_TRUE(fs::is_empty(dir_ / "shm")) << "the job's arena file is left in " << (dir_ / "shm");
}

INSTANTIATE_TEST_SUITE_P(Crashing, FailureDrill, ::testing::Values("trainer", "loader"));

}  // namespace
}  // namespace nodal::testing
