// The torch.distributed backend (integrations/torch) under nodalrun with Debian's python3-torch:
// every op against gloo's result and a rank-order reference at 2, 3 and 4 ranks; DDP training to
// gloo's parameters; a SIGKILLed rank mid-training ends the job named, its peers' torch raising
// PeerFailure; a default group that is not nodal's world refused; ProcessGroupNodal from C++; and
// every op on two nodes (mpirun, one nodalrun per node on this host).
#include <gtest/gtest.h>

#include <chrono>
#include <regex>
#include <string>
#include <vector>

#include "../support/child_process.hpp"
#include "../support/paths.hpp"

namespace nodal::testing {
namespace {

using namespace std::chrono_literals;

const std::string kPython = NODAL_TEST_PYTHON;
const std::string kScripts = NODAL_TEST_TORCH_SCRIPTS;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// nodalrun -n N python3 SCRIPT ARGS..., with the built nodal_torch module on PYTHONPATH.
ChildResult run_script(int n, const std::string& script, std::vector<std::string> args = {},
                       std::chrono::milliseconds timeout = 150s) {
  std::vector<std::string> argv = {kNodalrun, "-n", std::to_string(n), kPython, kScripts + "/" + script};
  argv.insert(argv.end(), args.begin(), args.end());
  return run(argv, timeout, {"PYTHONPATH=" NODAL_TEST_TORCH_MODULE_DIR, "PYTHONDONTWRITEBYTECODE=1"});
}

class TorchRanks : public ::testing::TestWithParam<int> {};

#ifdef NODAL_TEST_MPIRUN
TEST(TorchAcrossNodes, EveryOpMatchesGlooOnTwoNodesOfTwoRanks) {
  // mpirun starts two nodalruns on this host, each its own node of 2 ranks: ops.py's even and odd
  // subgroups then span the nodes, and its send/recv ring crosses them; groups of each node's
  // ranks too.
  std::vector<std::string> argv = {NODAL_TEST_MPIRUN, "-n", "2", "--oversubscribe", "--mca", "btl", "tcp,self",
                                   "--bind-to", "none", "-x", "PYTHONPATH", "-x", "PYTHONDONTWRITEBYTECODE",
                                   kNodalrun, "-n", "2", kPython, kScripts + "/ops.py"};
  ChildResult r = run(argv, 150s,
                      {"PYTHONPATH=" NODAL_TEST_TORCH_MODULE_DIR, "PYTHONDONTWRITEBYTECODE=1", "OMPI_ALLOW_RUN_AS_ROOT=1",
                       "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1", "LSAN_OPTIONS=detect_leaks=0"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(count_lines(r.out, R"(^\[\d+\] ops ok: [1-9]\d+ checks$)"), 4) << r.out;
}
#endif

TEST_P(TorchRanks, EveryOpMatchesGlooAndTheRankOrderReference) {
  const int n = GetParam();
  ChildResult r = run_script(n, "ops.py");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(count_lines(r.out, R"(^\[\d+\] ops ok: [1-9]\d+ checks$)"), n) << r.out;
}

/// ddp.py's verdict on every one of `n` ranks after `steps` steps: its parameters match gloo's run
/// (the same bits on 2 ranks, where both add in the same order, one addition per element; from
/// three on gloo's ring adds in another order than nodal's rank order) and every rank agrees.
void expect_ddp_matches_gloo(const ChildResult& r, int n, int steps) {
  std::regex line(R"(\[(\d+)\] ddp: )" + std::to_string(steps) +
                  R"( steps, max difference (\S+), identical (True|False), ranks agree (True|False))");
  int seen = 0;
  for (const auto& l : lines_of(r.out)) {
    std::smatch m;
    if (!std::regex_match(l, m, line)) continue;
    ++seen;
    EXPECT_EQ(m[4].str(), "True") << l;
    if (n == 2) {
      EXPECT_EQ(m[3].str(), "True") << l;
    }
    EXPECT_LT(std::stod(m[2].str()), 1e-5) << l;
  }
  EXPECT_EQ(seen, n) << r.out;
}

TEST_P(TorchRanks, DdpTrainsToGloosParametersAndEveryRankAgrees) {
  const int n = GetParam();
  ChildResult r = run_script(n, "ddp.py", {"--steps", "300"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  expect_ddp_matches_gloo(r, n, 300);
}

TEST_P(TorchRanks, DdpOverTheArenaAllocatorReducesBucketsInPlaceToGloosParameters) {
  // Every tensor from 4 KiB in the arena, DDP's gradient bucket among them: nodal reduces it in
  // place in the arena (the in_place algorithm), with the same results as before.
  const int n = GetParam();
  ChildResult r = run_script(n, "ddp.py", {"--steps", "100", "--arena-min-bytes", "4096"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(count_lines(r.out, R"(^\[\d+\] bucket allreduce: in_place$)"), n) << r.out;
  expect_ddp_matches_gloo(r, n, 100);
}

TEST_P(TorchRanks, TheArenaAllocatorPlacesLargeTensorsInTheArenaAndFallsBackWhenFull) {
  const int n = GetParam();
  ChildResult r = run({kNodalrun, "-n", std::to_string(n), "--shm-size", "160M", kPython, kScripts + "/arena_allocator.py"},
                      120s, {"PYTHONPATH=" NODAL_TEST_TORCH_MODULE_DIR, "PYTHONDONTWRITEBYTECODE=1"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(count_lines(r.out, R"(^\[\d+\] arena allocator ok: [1-9]\d+ checks$)"), n) << r.out;
  EXPECT_TRUE(contains(r.err + r.out, "the job's arena has no room for a tensor of")) << r.err;
}

TEST(TorchBackend, NodalTorchArenaMinBytesInstallsTheArenaAllocatorAtInit) {
  const std::vector<std::string> env = {"PYTHONPATH=" NODAL_TEST_TORCH_MODULE_DIR, "PYTHONDONTWRITEBYTECODE=1"};
  ChildResult r = run({kNodalrun, "-n", "2", "-x", "NODAL_TORCH_ARENA_MIN_BYTES=64K", kPython,
                       kScripts + "/arena_allocator.py", "--env", "64K"},
                      60s, env);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(count_lines(r.out, R"(^\[\d\] env: installed True, min_bytes 65536$)"), 2) << r.out;
  r = run({kNodalrun, "-n", "2", "-x", "NODAL_TORCH_ARENA_MIN_BYTES=lots", kPython, kScripts + "/arena_allocator.py",
           "--env", "lots"},
          60s, env);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(count_lines(r.out, R"(^\[\d\] env refused: .*NODAL_TORCH_ARENA_MIN_BYTES: .*)"), 2) << r.out;
}

INSTANTIATE_TEST_SUITE_P(TorchBackend, TorchRanks, ::testing::Values(2, 3, 4),
                         [](const auto& p) { return "n" + std::to_string(p.param); });

TEST(TorchBackend, ASigkilledRankEndsTheJobNamedAndItsPeersRaisePeerFailure) {
  const std::string marker = "--steps=100000";  // unique to this test's ranks
  ChildResult r = run_script(3, "ddp.py", {marker, "--kill-rank", "1", "--kill-step", "40"}, 60s);
  EXPECT_EQ(r.exit_code, 128 + 9) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "nodalrun: rank 1 (pid ")) << r.err;
  EXPECT_TRUE(contains(r.err, "killed by SIGKILL")) << r.err;
  std::regex caught(R"(\[(0|2)\] rank \d caught RuntimeError after (\d+) ms: nodal: allreduce: PeerFailure: .*rank 1: killed by SIGKILL.*)");
  int peers = 0;
  for (const auto& l : lines_of(r.out)) {
    std::smatch m;
    if (!std::regex_match(l, m, caught)) continue;
    ++peers;
    EXPECT_LT(std::stoi(m[2].str()), 1000) << l;
  }
  EXPECT_EQ(peers, 2) << r.out;
  EXPECT_TRUE(survivors_mentioning(marker, 5s).empty());
}

TEST(TorchBackend, ADefaultGroupThatIsNotNodalsWorldIsRefused) {
  ChildResult r = run_script(2, "wrong_rank.py", {}, 60s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(count_lines(r.out, R"(refused: nodal: torch's default group is rank \d of 2, but this process is rank \d of 2)"), 2)
      << r.out;
}

TEST(TorchBackend, TheDdpExampleTrainsFashionMnistAsWithGloo) {
  // examples/torch_ddp/train.py, one epoch under each backend: the same loss to the printed digits
  // (2 ranks: the same bits), and a real accuracy.
  std::string lines[2];
  const char* backends[2] = {"nodal", "gloo"};
  for (int i = 0; i < 2; ++i) {
    ChildResult r = run({kNodalrun, "-n", "2", kPython, NODAL_TEST_TORCH_EXAMPLE, "--epochs", "1", "--backend", backends[i]},
                        120s, {"PYTHONPATH=" NODAL_TEST_TORCH_MODULE_DIR, "PYTHONDONTWRITEBYTECODE=1"});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    std::smatch m;
    std::regex result(R"(\[0\] epoch 1: loss (\S+)\n\[0\] backend \w+, 2 ranks: test accuracy (\S+),)");
    ASSERT_TRUE(std::regex_search(r.out, m, result)) << r.out;
    EXPECT_GE(std::stod(m[2].str()), 0.8) << r.out;
    lines[i] = m[1].str() + " " + m[2].str();
  }
  EXPECT_EQ(lines[0], lines[1]);
}

TEST(TorchBackend, LibtorchProgramsUseProcessGroupNodalDirectly) {
  for (int n : {1, 3}) {
    ChildResult r = run({kNodalrun, "-n", std::to_string(n), NODAL_TEST_TORCH_PROGRAM}, 60s);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_EQ(count_lines(r.out, R"(libtorch ok: \d+ checks)"), n) << r.out;
  }
}

}  // namespace
}  // namespace nodal::testing
