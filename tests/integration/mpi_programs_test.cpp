// Unmodified MPI programs under nodalrun (`--mpi`, launcher/src/pmi/): MPICH's ranks find each
// other through nodalrun's PMI-1 server, Open MPI's through its PMIx server, so `nodalrun -n N
// ./prog` is one N-rank job (not N singletons), with collectives and point-to-point that work;
// and the ways an MPI job fails end it like any other failure: MPI_Abort's code is the exit
// code with the rank named, a SIGKILLed rank ends the job within a second, a rank that dies in
// MPI_Init, skips it, or skips MPI_Finalize fails the job, and nothing is left running.
#include <gtest/gtest.h>

#include <sys/time.h>

#include <chrono>
#include <filesystem>
#include <ostream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "../support/child_process.hpp"
#include "../support/temp_dir.hpp"
#include "../support/paths.hpp"

namespace nodal::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

struct Flavour {
  std::string name;     ///< mpich or openmpi
  std::string program;  ///< mpi_program built with its mpicc ("" when the machine lacks it)
  std::string package;  ///< what to install
};

void PrintTo(const Flavour& flavour, std::ostream* os) { *os << flavour.name; }

std::string flavour_name(const ::testing::TestParamInfo<Flavour>& info) { return info.param.name; }

double realtime_now() {
  timeval now{};
  ::gettimeofday(&now, nullptr);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_usec) * 1e-6;
}

class MpiPrograms : public ::testing::TestWithParam<Flavour> {
 protected:
  void SetUp() override {
    if (GetParam().program.empty()) {
      GTEST_SKIP() << "no mpicc for " << GetParam().name << ": install " << GetParam().package
                   << " (scripts/setup-debian.sh) and reconfigure";
    }
  }

  /// nodalrun -n N [launcher args] mpi_program MODE ARGS... MARKER, with TMPDIR in the test's own
  /// directory (where nodalrun's PMIx server keeps its rendezvous files).
  ChildResult run_job(int n, std::vector<std::string> mode, std::vector<std::string> launcher = {}) {
    std::vector<std::string> args = {"-n", std::to_string(n)};
    args.insert(args.end(), launcher.begin(), launcher.end());
    args.push_back(GetParam().program);
    args.insert(args.end(), mode.begin(), mode.end());
    args.push_back(marker());  // ignored by the program; finds its processes
    return run(nodalrun_command(args), 60s, {"TMPDIR=" + dir_.path()});
  }

  /// Nothing of the job runs any more (after a short while for the reaping) and nothing is left
  /// in TMPDIR.
  void expect_nothing_left() {
    const std::vector<pid_t> left = survivors_mentioning(marker(), 2s);
    EXPECT_TRUE(left.empty()) << left.size() << " process(es) of the job survived it, first pid " << left.front();
    EXPECT_TRUE(fs::is_empty(dir_.path())) << "left in TMPDIR: " << fs::directory_iterator(dir_.path())->path();
  }

  std::string marker() const { return "nodal-mpi-test-marker-" + fs::path(dir_.path()).filename().string(); }

  TempDir dir_{"nodal-mpi-test"};
};

TEST_P(MpiPrograms, RanksFormOneJobWithWorkingCollectivesAndPointToPoint) {
  for (int n : {2, 3, 4}) {
    ChildResult r = run_job(n, {"hello"});
    ASSERT_FALSE(r.timed_out) << n << " ranks";
    EXPECT_EQ(r.exit_code, 0) << n << " ranks:\n" << r.out << r.err;
    const int sum = n * (n + 1) / 2;
    for (int rank = 0; rank < n; ++rank) {
      const std::string expected = "[" + std::to_string(rank) + "] rank " + std::to_string(rank) + " of " +
                                   std::to_string(n) + ": allreduce " + std::to_string(sum) + " bcast " +
                                   std::to_string(1000 + n) + " ring " + std::to_string((rank + n - 1) % n) + " ok";
      EXPECT_TRUE(contains(r.out, expected)) << "missing \"" << expected << "\" in:\n" << r.out << r.err;
    }
    EXPECT_FALSE(contains(r.out, " of 1:")) << "the ranks ran as singletons:\n" << r.out;
  }
  expect_nothing_left();
}

TEST_P(MpiPrograms, MpiAbortsCodeIsTheExitCodeWithTheRankNamed) {
  ChildResult r = run_job(3, {"abort", "1", "7"});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 7) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "nodalrun: rank 1 (pid")) << r.err;
  EXPECT_TRUE(contains(r.err, "called MPI_Abort with error code 7")) << r.err;
  EXPECT_TRUE(contains(r.err, "stopped 2 other rank(s)")) << r.err;
  expect_nothing_left();
}

TEST_P(MpiPrograms, ARestartedJobIsWiredUpAgain) {
  // Each attempt wires up anew (the PMIx server outlives the first attempt, PMIx 4.2 cannot start
  // a second one): the second attempt's ranks reach MPI_Abort too.
  ChildResult r = run_job(2, {"abort", "1", "7"}, {"--max-restarts", "1"});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 7) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "nodalrun: restarting the job (restart 1 of 1)")) << r.err;
  EXPECT_EQ(count_lines(r.err, "rank 1 \\(pid [0-9]+\\) failed first.*called MPI_Abort with error code 7"), 2) << r.err;
  expect_nothing_left();
}

TEST_P(MpiPrograms, ASigkilledRankEndsTheJobWithinASecond) {
  ChildResult r = run_job(3, {"kill", "2"});
  const double ended = realtime_now();
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 137) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "nodalrun: rank 2 (pid")) << r.err;
  EXPECT_TRUE(contains(r.err, "SIGKILL")) << r.err;
  std::smatch match;
  ASSERT_TRUE(std::regex_search(r.out, match, std::regex(R"(killed at ([0-9.]+))"))) << r.out;
  const double killed = std::stod(match[1]);
  EXPECT_LT(ended - killed, 1.0) << "from the kill to nodalrun's exit";
  expect_nothing_left();
}

TEST_P(MpiPrograms, ARankThatDiesInMpiInitEndsTheJob) {
  ChildResult r = run_job(2, {"die-in-init", "1"});
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_EQ(r.exit_code, 137) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "nodalrun: rank 1 (pid")) << r.err;
  expect_nothing_left();
}

TEST_P(MpiPrograms, ARankThatNeverCallsMpiInitFailsTheJob) {
  ChildResult r = run_job(3, {"skip-init", "2"});
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "nodalrun: rank 2 (pid")) << r.err;
  EXPECT_TRUE(contains(r.err, "without calling MPI_Init")) << r.err;
  expect_nothing_left();
}

TEST_P(MpiPrograms, ARankThatSkipsMpiFinalizeFailsTheJob) {
  ChildResult r = run_job(2, {"no-finalize", "0"});
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "nodalrun: rank 0 (pid")) << r.err;
  EXPECT_TRUE(contains(r.err, "without calling MPI_Finalize")) << r.err;
  expect_nothing_left();
}

TEST_P(MpiPrograms, WithoutWireUpTheRanksAreNotOneJob) {
  // --mpi none: what nodalrun did before it served MPI (and what the tests above would see if the
  // wire-up broke): Open MPI's ranks run as singletons ("rank 0 of 1" twice), MPICH 4.0's
  // singletons hang in MPI_Init (run alone, too), which --timeout ends.
  ChildResult r = run_job(2, {"hello"}, {"--mpi", "none", "--timeout", "3"});
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_FALSE(contains(r.out, " of 2:")) << r.out << r.err;
  if (GetParam().name == "openmpi") {
    EXPECT_TRUE(contains(r.out, "[0] rank 0 of 1:") && contains(r.out, "[1] rank 0 of 1:")) << r.out << r.err;
  } else {
    EXPECT_EQ(r.exit_code, 124) << r.out << r.err;
  }
}

INSTANTIATE_TEST_SUITE_P(Flavours, MpiPrograms,
                         ::testing::Values(Flavour{"mpich", NODAL_TEST_MPI_PROGRAM_MPICH, "libmpich-dev"},
                                           Flavour{"openmpi", NODAL_TEST_MPI_PROGRAM_OPENMPI, "libopenmpi-dev"}),
                         flavour_name);

}  // namespace
}  // namespace nodal::testing
