// The Fashion-MNIST job's failure drill: one process crashes mid-training; nodalrun must name it,
// exit with its code, and leave no process and no shared memory behind.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "../support/child_process.hpp"
#include "../support/fashion_mnist.hpp"
#include "../support/paths.hpp"

namespace nodal::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

class FailureDrill : public ::testing::TestWithParam<std::string> {  // who crashes: trainer or dataset
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
    // The dataset throws in a DataLoader worker of trainer 1, whose next() rethrows it, naming the
    // worker and the sample.
    EXPECT_TRUE(contains(r.err, "nodal::ProcessRaisedError: process ")) << r.err;
    EXPECT_TRUE(contains(r.err, "(DataLoader worker 0, loading sample ")) << r.err;
    EXPECT_TRUE(contains(r.err, "failure drill: the dataset of trainer 1 fails on sample ")) << r.err;
    EXPECT_TRUE(contains(r.err, " at step 5")) << r.err;
  }
  EXPECT_TRUE(contains(r.err, "stopped 1 other rank(s)")) << r.err;

  // The job's ranks and their DataLoader workers carry the test's own directory in their arguments.
  const std::vector<pid_t> left = survivors_mentioning(dir_.path(), 2s);
  EXPECT_TRUE(left.empty()) << left.size() << " process(es) of the job survived it, first pid " << left.front();
  EXPECT_TRUE(fs::is_empty(dir_ / "shm")) << "the job's arena file is left in " << (dir_ / "shm");
}

INSTANTIATE_TEST_SUITE_P(Crashing, FailureDrill, ::testing::Values("trainer", "dataset"));

/// The weights fingerprint the summary prints ("" when it is missing).
std::string fingerprint_of(const std::string& out) {
  const std::string key = "weights fingerprint ";
  std::size_t at = out.find(key);
  return at == std::string::npos ? std::string() : out.substr(at + key.size(), 16);
}

TEST_P(FailureDrill, ARestartResumesFromTheCheckpointToTheSameWeights) {
  const std::vector<std::string> run_args = {kFashionMnist, "--train-subset", "4096", "--epochs", "2", "--test-subset",
                                             "500"};
  std::vector<std::string> undisturbed = {"-n", "2"};
  undisturbed.insert(undisturbed.end(), run_args.begin(), run_args.end());
  undisturbed.insert(undisturbed.end(), {"--dump-weights", dir_ / "undisturbed"});
  ChildResult reference = run(nodalrun_command(undisturbed), 120s);
  ASSERT_EQ(reference.exit_code, 0) << reference.err;

  // The crash at step 21 (of 32) comes after the checkpoint of step 20 and before the next one:
  // the restarted job retrains step 20 from the checkpoint's weights and momentum.
  std::vector<std::string> drill = {"-n", "2", "--max-restarts", "1", "--report", dir_ / "report.json"};
  drill.insert(drill.end(), run_args.begin(), run_args.end());
  drill.insert(drill.end(), {"--checkpoint-every", "4", "--checkpoint", dir_ / "ckpt", "--fail-at-step", "21",
                             "--fail-rank", "1", "--fail-in", GetParam(), "--dump-weights", dir_ / "restarted"});
  ChildResult r = run(nodalrun_command(drill), 120s);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "failure drill")) << "the drill never fired: " << r.err;
  EXPECT_TRUE(contains(r.err, "nodalrun: restarting the job (restart 1 of 1)")) << r.err;
  EXPECT_TRUE(contains(r.out, "resuming from " + (dir_ / "ckpt") + " at step 20")) << r.out;
  EXPECT_EQ(fingerprint_of(r.out), fingerprint_of(reference.out)) << r.out;
  EXPECT_EQ(first_difference(read_file(dir_ / "restarted"), read_file(dir_ / "undisturbed")), "equal");
  const std::string report = read_file(dir_ / "report.json");
  EXPECT_TRUE(contains(report, R"("attempt":0)") && contains(report, R"("attempt":1)")) << report;
  EXPECT_TRUE(contains(report, R"("kind":"success")")) << report;
  EXPECT_FALSE(fs::exists(dir_ / "ckpt.tmp")) << "a temporary checkpoint was left behind";
}

}  // namespace
}  // namespace nodal::testing
