// nodalrun across nodes: Open MPI's mpirun starts one nodalrun per node (loopback: each nodalrun on
// this host is its own node; netns: nodes in network namespaces, tests/support/netns-cluster.sh).
#include <gtest/gtest.h>

#include <boost/json/src.hpp>

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "child_process.hpp"
#include "fashion_mnist.hpp"
#include "paths.hpp"

namespace {

using namespace std::chrono_literals;
using nodal::testing::ChildProcess;
using nodal::testing::ChildResult;

/// mpirun as root (CI), and no leak check at exit in the ASan build: Open MPI's allocations in
/// nodalrun outlive MPI_Finalize, and its components' stacks cannot be told apart from nodalrun's
/// (ASan's memory checks stay on; nodal's own code is leak-checked by every other test).
const std::vector<std::string> kRootEnv = {"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
                                           "LSAN_OPTIONS=detect_leaks=0"};

/// mpirun starting `nodes` nodalruns on this host, each running `ranks` ranks of `program`.
std::vector<std::string> loopback(int nodes, int ranks, std::vector<std::string> program) {
  std::vector<std::string> argv = {NODAL_TEST_MPIRUN, "-n", std::to_string(nodes), "--oversubscribe", "--mca", "btl",
                                   "tcp,self", "--bind-to", "none", NODAL_TEST_NODALRUN, "-n", std::to_string(ranks)};
  argv.insert(argv.end(), program.begin(), program.end());
  return argv;
}

ChildResult run_job(const std::vector<std::string>& argv, std::vector<std::string> env = {},
                    std::chrono::milliseconds timeout = 120s) {
  env.insert(env.end(), kRootEnv.begin(), kRootEnv.end());
  return nodal::testing::run(argv, timeout, env);
}

/// rank -> digest from coll_program matrix's "rank r ok N checks digest D" lines.
std::map<int, std::string> digests(const std::string& out) {
  std::map<int, std::string> result;
  std::regex line(R"(rank (\d+) ok \d+ checks digest ([0-9a-f]+))");
  for (std::sregex_iterator it(out.begin(), out.end(), line), end; it != end; ++it) {
    result[std::stoi((*it)[1])] = (*it)[2];
  }
  return result;
}

TEST(MultiNode, RanksAndEnvironmentFollowTorchrunsRule) {
  ChildResult r = run_job(loopback(2, 2, {NODAL_TEST_MULTINODE_PROGRAM, "env"}));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int rank = 0; rank < 4; ++rank) {
    const int node = rank / 2;
    const std::string expected = "[" + std::to_string(rank) + "] rank=" + std::to_string(rank) + " world=4 local=" +
                                 std::to_string(rank % 2) + "/2 group=" + std::to_string(node) + "/2 node=" +
                                 std::to_string(node) + "/2 master=";
    EXPECT_NE(r.out.find(expected), std::string::npos) << "missing: " << expected << "\n" << r.out;
  }
  EXPECT_EQ(nodal::testing::count_lines(r.out, "launcher_vars=0"), 4) << "PMIX_/OMPI_/PMI_ reached a rank:\n" << r.out;
  // One MASTER_ADDR:MASTER_PORT for the whole job: node 0's host and a port free there.
  std::set<std::string> masters;
  std::regex master(R"( master=(\S+):(\d+) )");
  for (std::sregex_iterator it(r.out.begin(), r.out.end(), master), end; it != end; ++it) {
    masters.insert((*it)[0]);
    EXPECT_GT(std::stoi((*it)[2]), 0) << (*it)[0];
  }
  EXPECT_EQ(masters.size(), 1u) << r.out;
}

/// Checks that multinode_program env's two ranks (one per node, on this machine) ran on one CPU
/// each, and not the same one: the nodes share this machine's cores (placement.hpp HostShare).
void expect_ranks_on_different_cores(const std::string& out) {
  std::map<int, std::string> cpus;
  std::regex line(R"(\[(\d+)\] rank=\d+ .* cpus=(\S+))");
  for (std::sregex_iterator it(out.begin(), out.end(), line), end; it != end; ++it) cpus[std::stoi((*it)[1])] = (*it)[2];
  ASSERT_EQ(cpus.size(), 2u) << out;
  EXPECT_EQ(cpus[0].find(','), std::string::npos) << "rank 0 is not bound to one core:\n" << out;
  EXPECT_EQ(cpus[1].find(','), std::string::npos) << "rank 1 is not bound to one core:\n" << out;
  EXPECT_NE(cpus[0], cpus[1]) << out;
}

TEST(MultiNode, NodesOnOneHostBindTheirRanksToDifferentCores) {
  // Two nodalruns on this host are two nodes sharing its cores: node 1's rank takes the core
  // after node 0's, not core 0 again.
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "needs 2 CPUs";
  ChildResult r = run_job(loopback(2, 1, {NODAL_TEST_MULTINODE_PROGRAM, "env"}));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  expect_ranks_on_different_cores(r.out);
}

TEST(MultiNode, UnderSlurmEveryRankIsATaskOfItsOwnWithEitherStartMethod) {
  // srun's per-task values (here beside mpirun's, which places the agents) are rewritten for
  // each rank: SLURM_PROCID its global rank, SLURM_LOCALID its local rank, SLURM_NTASKS the world.
  for (const char* method : {"spawn", "forkserver"}) {
    std::vector<std::string> argv = loopback(2, 2, {NODAL_TEST_MULTINODE_PROGRAM, "env"});
    argv.insert(argv.end() - 2, {"--start-method", method});
    ChildResult r = run_job(argv, {"SLURM_PROCID=0", "SLURM_LOCALID=0", "SLURM_NTASKS=2"});
    ASSERT_EQ(r.exit_code, 0) << method << "\n" << r.out << r.err;
    for (int rank = 0; rank < 4; ++rank) {
      const std::string expected = "[" + std::to_string(rank) + "] rank=" + std::to_string(rank) + " ";
      const std::string slurm = "slurm=" + std::to_string(rank) + "/" + std::to_string(rank % 2) + "/4";
      const auto line = r.out.find(expected);
      ASSERT_NE(line, std::string::npos) << method << "\n" << r.out;
      const std::string text = r.out.substr(line, r.out.find('\n', line) - line);
      EXPECT_TRUE(text.ends_with(" " + slurm)) << method << ": " << text << " (expected " << slurm << ")";
    }
  }
}

TEST(MultiNode, NodesThatDisagreeOnHowTheAgentsMoveStepsAreAUsageError) {
  // MPMD: node 0 and node 1 each get their own value of `variable`.
  for (auto [variable, value0, value1, message] :
       {std::tuple{"NODAL_NODE_BUFFER_BYTES", "1M", "2M",
                   "NODAL_NODE_BUFFER_BYTES differs between nodes: node 0 has 1048576, node 1 2097152"},
        std::tuple{"NODAL_NODE_FOLD_MIN_BYTES", "64K", "off",
                   "NODAL_NODE_FOLD_MIN_BYTES differs between nodes: node 0 has 65536, node 1 off"},
        std::tuple{"NODAL_NODE_DIRECT_MAX_NODES", "8", "1",
                   "NODAL_NODE_DIRECT_MAX_NODES differs between nodes: node 0 has 8, node 1 1"}}) {
    SCOPED_TRACE(variable);
    auto node = [&](const char* value) {
      return std::vector<std::string>{"-n", "1", "-x", std::string(variable) + "=" + value,
                                      NODAL_TEST_NODALRUN, "-n", "1", NODAL_TEST_MULTINODE_PROGRAM, "env"};
    };
    std::vector<std::string> argv = {NODAL_TEST_MPIRUN, "--oversubscribe", "--mca", "btl", "tcp,self", "--bind-to", "none"};
    for (const std::string& word : node(value0)) argv.push_back(word);
    argv.push_back(":");
    for (const std::string& word : node(value1)) argv.push_back(word);
    ChildResult r = run_job(argv, {}, 60s);
    ASSERT_FALSE(r.timed_out) << r.err;
    EXPECT_NE(r.exit_code, 0) << r.out << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
    EXPECT_EQ(r.out.find("rank="), std::string::npos) << "a rank started:\n" << r.out;
  }
}

TEST(MultiNode, CollectivesAcrossNodesGiveTheOneNodeBits) {
  // Every collective against coll_program's own reference, at sizes that take one and several
  // steps of the node buffer; the digest of all results must equal a one-node job's. The large
  // reductions take the folded shape (node_bridge.hpp): on 3 nodes through a middle node, with a
  // 2 MiB buffer in steps of 2 and 1 segments of folded_step.cpp (100000 f64: 699 KB + 101 KB per
  // rank); with NODAL_NODE_FOLD_MIN_BYTES=off the gathered one, to the same bits. On 3 nodes with
  // NODAL_NODE_DIRECT_MAX_NODES=2, the agents' rounds are the MPI library's collectives (as beyond 8
  // nodes by default): fixed blocks of 1 KiB of data with the descriptions, allgatherv, broadcast.
  const std::vector<std::string> matrix = {NODAL_TEST_COLL_PROGRAM, "matrix", "sizes=4,1024,100000"};
  for (auto [nodes, ranks, fold, buffer, direct] :
       {std::tuple{2, 2, true, "1M", "8"}, std::tuple{3, 1, true, "2M", "8"}, std::tuple{2, 2, false, "1M", "8"},
        std::tuple{3, 1, false, "1M", "2"}}) {
    SCOPED_TRACE(std::to_string(nodes) + " nodes x " + std::to_string(ranks) + " ranks, fold " + (fold ? "on" : "off") +
                 ", direct up to " + direct + " nodes");
    ChildResult across = run_job(loopback(nodes, ranks, matrix), {std::string("NODAL_NODE_BUFFER_BYTES=") + buffer,
                                                                  fold ? "NODAL_NODE_FOLD_MIN_BYTES=0" : "NODAL_NODE_FOLD_MIN_BYTES=off",
                                                                  std::string("NODAL_NODE_DIRECT_MAX_NODES=") + direct});
    ASSERT_EQ(across.exit_code, 0) << across.out << across.err;
    std::vector<std::string> one_node = {NODAL_TEST_NODALRUN, "-n", std::to_string(nodes * ranks)};
    one_node.insert(one_node.end(), matrix.begin(), matrix.end());
    ChildResult single = nodal::testing::run(one_node, 120s);
    ASSERT_EQ(single.exit_code, 0) << single.out << single.err;
    EXPECT_EQ(nodal::testing::count_lines(across.out, "algorithms private:across_nodes="), nodes * ranks) << across.out;
    EXPECT_EQ(nodal::testing::count_lines(across.out, "private:folded_across_nodes="), fold ? nodes * ranks : 0)
        << across.out;
    EXPECT_EQ(nodal::testing::count_lines(across.out, "shared:folded_across_nodes="), fold ? nodes * ranks : 0)
        << across.out;
    const auto a = digests(across.out), s = digests(single.out);
    EXPECT_EQ(a.size(), static_cast<std::size_t>(nodes * ranks)) << across.out;
    EXPECT_EQ(a, s) << "across nodes:\n" << across.out << "one node:\n" << single.out;
  }
}

TEST(MultiNode, GroupsThatSpanNodesWorkAsOnOneNode) {
  // coll_program split: key order, negative colors, overlapping and nested groups, groups made
  // by their members alone (and the refusal of a set listed in two orders), groups made and
  // dropped, then the matrix in the groups of color rank % 3 at once; every result against the
  // program's reference, and each rank's digest of its group's results equal to a one-node job's.
  // 2 x 2: groups {0, 3}, {1}, {2} (the first spans nodes); 3 x 1: every group of two spans nodes.
  // A 256 KiB node buffer: the larger calls run in several segments.
  const std::vector<std::string> split = {NODAL_TEST_COLL_PROGRAM, "split", "sizes=4,1024,100000"};
  std::regex line(R"(rank (\d+) color \d+ \(rank \d+ of \d+\) ok \d+ checks digest ([0-9a-f]+))");
  auto group_digests = [&](const std::string& out) {
    std::map<int, std::string> result;
    for (std::sregex_iterator it(out.begin(), out.end(), line), end; it != end; ++it) result[std::stoi((*it)[1])] = (*it)[2];
    return result;
  };
  for (auto [nodes, ranks] : {std::pair{2, 2}, std::pair{3, 1}}) {
    SCOPED_TRACE(std::to_string(nodes) + " nodes x " + std::to_string(ranks) + " ranks");
    ChildResult across = run_job(loopback(nodes, ranks, split), {"NODAL_NODE_BUFFER_BYTES=256K"});
    ASSERT_EQ(across.exit_code, 0) << across.out << across.err;
    EXPECT_EQ(nodal::testing::count_lines(across.out, R"(rank \d+ split ok)"), nodes * ranks) << across.out;
    std::vector<std::string> one_node = {NODAL_TEST_NODALRUN, "-n", std::to_string(nodes * ranks)};
    one_node.insert(one_node.end(), split.begin(), split.end());
    ChildResult single = nodal::testing::run(one_node, 120s);
    ASSERT_EQ(single.exit_code, 0) << single.out << single.err;
    const auto a = group_digests(across.out), s = group_digests(single.out);
    EXPECT_EQ(a.size(), static_cast<std::size_t>(nodes * ranks)) << across.out;
    EXPECT_EQ(a, s) << "across nodes:\n" << across.out << "one node:\n" << single.out;
    if (ranks == 2) {  // the group that spans nodes ran over send/recv between its members
      EXPECT_EQ(nodal::testing::count_lines(across.out, R"(color 0 \(rank \d of 2\) ok .* algorithms private:across_nodes_ring=)"),
                2)
          << across.out;
    }
  }
}

TEST(MultiNode, FashionMnistOnTwoNodesLearnsTheOneNodeWeights) {
  // The main example at 2 nodes x 2 ranks: the same weights, bit for bit, as 4 ranks on one node.
  if (!nodal::testing::have_fashion_mnist_data()) {
    GTEST_SKIP() << nodal::testing::kFashionMnistData << " is missing: install dataset-fashion-mnist (scripts/setup-debian.sh)";
  }
  nodal::testing::TempDir dir("nodal-multinode-fm");
  const std::vector<std::string> job = {nodal::testing::kFashionMnist, "--train-subset", "4096", "--epochs", "2",
                                        "--test-subset", "500"};
  std::vector<std::string> across = job, single = {NODAL_TEST_NODALRUN, "-n", "4"};
  across.insert(across.end(), {"--dump-weights", dir / "across"});
  single.insert(single.end(), job.begin(), job.end());
  single.insert(single.end(), {"--dump-weights", dir / "single"});
  ChildResult a = run_job(loopback(2, 2, across));
  ASSERT_EQ(a.exit_code, 0) << a.out << a.err;
  ChildResult s = nodal::testing::run(single, 120s);
  ASSERT_EQ(s.exit_code, 0) << s.out << s.err;
  EXPECT_NE(a.out.find("on 4 trainer(s)"), std::string::npos) << a.out;
  EXPECT_EQ(nodal::testing::first_difference(nodal::testing::read_file(dir / "across"),
                                             nodal::testing::read_file(dir / "single")),
            "equal");
}

TEST(MultiNode, TheEngineSaysHowManyBytesEachReceiveGot) {
  // The agents' step messages are as long as each node needs (up to 64 KiB of data); the agent
  // checks each against its description (node_agent.cpp) by the length the engine reports.
  ChildResult r = run_job({NODAL_TEST_MPIRUN, "-n", "2", "--oversubscribe", "--mca", "btl", "tcp,self", "--bind-to",
                           "none", NODAL_TEST_ENGINE_PROGRAM, NODAL_TEST_ENGINE},
                          {}, 60s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int agent = 0; agent < 2; ++agent) {
    for (const std::string& expected :
         {"agent " + std::to_string(agent) + " up_to ok 5", "agent " + std::to_string(agent) + " exact ok",
          "agent " + std::to_string(agent) + " exact: an exchange received 60 bytes from agent " +
              std::to_string(1 - agent) + " where 100 were expected"}) {
      EXPECT_NE(r.out.find(expected), std::string::npos) << "missing: " << expected << "\n" << r.out << r.err;
    }
  }
}

TEST(MultiNode, MismatchedCallsAreAUsageErrorOnEveryRank) {
  // A 1 MiB node buffer: the large calls take 3 and 5 steps.
  ChildResult r = run_job(loopback(2, 2, {NODAL_TEST_MULTINODE_PROGRAM, "mismatch"}), {"NODAL_NODE_BUFFER_BYTES=1M"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  // Node 0's ranks differ among themselves (4 vs 9 elements): it names both calls; node 1 names node 0.
  EXPECT_EQ(nodal::testing::count_lines(r.out, "UsageError: ranks 0 and 1 on node 0 "), 4) << r.out;
  EXPECT_EQ(nodal::testing::count_lines(r.out, "made different calls: allreduce #1 of 4 x f32 and allreduce #1 of 9 x f32"),
            2)
      << r.out;
  EXPECT_EQ(nodal::testing::count_lines(r.out, "UsageError: the ranks of node 0 "), 4) << r.out;
  EXPECT_EQ(nodal::testing::count_lines(r.out, "made different calls: allreduce #4 of 150000 x f32 and allreduce #4 of "
                                               "300000 x f32"),
            2)
      << r.out;
  // The nodes differ (blocks of two lengths between the agents): every rank names both calls.
  EXPECT_EQ(nodal::testing::count_lines(r.out, R"(UsageError: the nodes made different calls: allreduce #7 of 2000 x f32 on )"
                                               R"(node 0 \(.*\), allreduce #7 of 4000 x f32 on node 1 )"),
            4)
      << r.out;
  // And the world works on after each, as on one node.
  EXPECT_EQ(nodal::testing::count_lines(r.out, "3 mismatches, usable after each"), 4) << r.out;
}

TEST(MultiNode, FoldedStepsAreFoldedInTheRanksFloatingPointMode) {
  // Ranks that flush denormals (torch.set_flush_denormal), or only flush results (FTZ), or only
  // zero denormal inputs (DAZ), or round upwards get the one-node bits of a folded allreduce, and
  // ranks in the default mode theirs: the agents fold in the mode the ranks posted
  // (nodal/detail/float_mode.hpp). Values chosen so that each mode changes the result, on node 0's
  // fold (A, B) or anywhere (C).
#if !defined(__x86_64__) && !defined(__i386__)
  GTEST_SKIP() << "floating-point modes are carried on x86 only";
#endif
  ChildResult r = run_job(loopback(2, 2, {NODAL_TEST_MULTINODE_PROGRAM, "float_mode"}));
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(nodal::testing::count_lines(r.out, "float modes ok"), 4) << r.out;
}

TEST(MultiNode, VectorCollectivesAcrossNodesMatchTheirReferenceAndCheckCounts) {
  // vector_program's references (uneven counts with zeros, small and large, staging regrown) and
  // its mismatches: the same UsageError on every rank of every node, and the world goes on.
  for (auto [nodes, ranks] : {std::pair{2, 2}, std::pair{3, 1}}) {
    SCOPED_TRACE(std::to_string(nodes) + " nodes x " + std::to_string(ranks) + " ranks");
    const int n = nodes * ranks;
    ChildResult r = run_job(loopback(nodes, ranks, {NODAL_TEST_VECTOR_PROGRAM, "results"}), {"NODAL_NODE_BUFFER_BYTES=64K"});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_EQ(nodal::testing::count_lines(r.out, R"(rank \d+: \d+ checks ok)"), n) << r.out;
    ChildResult m = run_job(loopback(nodes, ranks, {NODAL_TEST_VECTOR_PROGRAM, "mismatch"}));
    ASSERT_EQ(m.exit_code, 0) << m.out << m.err;
    EXPECT_EQ(nodal::testing::count_lines(
                  m.out, R"(UsageError: allgatherv on communicator 'world': rank 1 passes counts\[0\] = 5 but rank 0 passes 4)"),
              n)
        << m.out;
    EXPECT_EQ(nodal::testing::count_lines(m.out, "UsageError: alltoallv on communicator 'world': rank " + std::to_string(n - 1) +
                                                     " sends 2 elements to rank 0, which expects 3"),
              n)
        << m.out;
    EXPECT_EQ(nodal::testing::count_lines(m.out, "usable after the mismatches"), n) << m.out;
  }
}

TEST(MultiNode, SendRecvAcrossNodesAsOnOneNode) {
  // coll_program p2p: a 60-message sequence 0 -> 1 (every dtype, up to 8 MB, tags), every ordered
  // pair, a ring, a burst of 1000, a mismatch per direction (UsageError on both sides, the
  // direction unusable after), then collectives. 1 rank per node: every pair crosses nodes;
  // 2 x 2: pairs within and across nodes.
  for (auto [nodes, ranks] : {std::pair{2, 1}, std::pair{3, 1}, std::pair{2, 2}}) {
    SCOPED_TRACE(std::to_string(nodes) + " nodes x " + std::to_string(ranks) + " ranks");
    ChildResult r = run_job(loopback(nodes, ranks, {NODAL_TEST_COLL_PROGRAM, "p2p"}));
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    const int n = nodes * ranks;
    EXPECT_EQ(nodal::testing::count_lines(r.out, R"(rank \d+ p2p ok)"), n) << r.out;
    std::vector<std::pair<std::string, int>> cases = {{"send 8 recv 7", 1}, {"send tag 5 recv tag 6", 1}};
    if (n >= 3) cases.insert(cases.end(), {{"send f32 recv i32", 2}, {"send large recv large+1", 2}});
    for (const auto& [name, peer] : cases) {
      for (int rank : {0, peer}) {
        const std::string prefix = "rank " + std::to_string(rank) + " p2p case " + name;
        EXPECT_NE(r.out.find(prefix + ": UsageError: "), std::string::npos) << prefix << "\n" << r.out;
        EXPECT_NE(r.out.find(prefix + ", later call: UsageError: "), std::string::npos) << prefix << "\n" << r.out;
      }
    }
    EXPECT_NE(r.out.find("rank 0 p2p case send tag 5 recv tag 6: UsageError: recv of 8 x f32 (tag 6) from rank 1"),
              std::string::npos)
        << r.out;
  }
}

TEST(MultiNode, ARefusedOneChunkMessageAsTheLastCallEndsTheJobCleanly) {
  // The message crossed nodes before its receiver refused it (p2p_relay.hpp): when the ranks end
  // right after, the agents still finish moving it, and the job ends with nothing in flight.
  const auto start = std::chrono::steady_clock::now();
  ChildResult r = run_job(loopback(2, 1, {NODAL_TEST_MULTINODE_PROGRAM, "p2p_refused_last"}), {}, 60s);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int rank : {0, 1}) {
    const std::string expected = "rank " + std::to_string(rank) + ": refused: ";
    EXPECT_NE(r.out.find(expected), std::string::npos) << "missing: " << expected << "\n" << r.out;
  }
  EXPECT_EQ(r.err.find("did not release"), std::string::npos) << r.err;
  EXPECT_LT(seconds, 20) << r.out << r.err;
}

TEST(MultiNode, GroupsAndSendRecvWithinANodeWork) {
  for (auto [nodes, ranks] : {std::pair{2, 2}, std::pair{2, 3}}) {
    SCOPED_TRACE(std::to_string(nodes) + " nodes x " + std::to_string(ranks) + " ranks");
    ChildResult r = run_job(loopback(nodes, ranks, {NODAL_TEST_MULTINODE_PROGRAM, "local_groups"}));
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_EQ(nodal::testing::count_lines(r.out, "local groups ok"), nodes * ranks) << r.out;
  }
}

TEST(MultiNode, ARankKilledOnNodeBEndsEveryNodeNamingIt) {
  const auto start = std::chrono::steady_clock::now();
  ChildResult r = run_job(loopback(2, 2, {NODAL_TEST_MULTINODE_PROGRAM, "kill", "3"}), {}, 60s);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 137) << r.out << r.err;  // the killed rank's 128 + SIGKILL, from every node
  // Node 1 names its own rank; node 0 names it too, from the announcement.
  EXPECT_NE(r.err.find("rank 3 on node 1 ("), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("failed first: killed by SIGKILL"), std::string::npos) << r.err;
  // The ranks that were waiting got PeerFailure, within 5 s of the kill (each counts from its own
  // exit from a barrier: a failure seen at once can show as "-1 ms").
  std::regex line(R"(rank (\d): PeerFailure (-?\d+) ms after the kill)");
  int survivors = 0;
  for (std::sregex_iterator it(r.out.begin(), r.out.end(), line), end; it != end; ++it) {
    ++survivors;
    EXPECT_LT(std::stoi((*it)[2]), 5000) << (*it)[0];
  }
  EXPECT_GE(survivors, 2) << r.out;
  // Their messages name the job's rank 3 (on node 1 its local rank is 1), and no "rank -1".
  EXPECT_NE(r.out.find("the job has failed (rank 3: killed by SIGKILL)"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("rank -1"), std::string::npos) << r.out;
  EXPECT_LT(seconds, 20) << r.out << r.err;
}

TEST(MultiNode, SendRecvThreadsBesideCollectivesAcrossNodes) {
  // The agents move messages while a collective step is in flight, and the other way round.
  for (auto [nodes, ranks] : {std::pair{2, 2}, std::pair{3, 1}}) {
    SCOPED_TRACE(std::to_string(nodes) + " nodes x " + std::to_string(ranks) + " ranks");
    ChildResult r = run_job(loopback(nodes, ranks, {NODAL_TEST_MULTINODE_PROGRAM, "p2p_threads"}));
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_EQ(nodal::testing::count_lines(r.out, "p2p threads ok"), nodes * ranks) << r.out;
  }
}

TEST(MultiNode, ASenderKilledOnNodeBMidMessageFailsTheReceiverOnNodeA) {
  ChildResult r = run_job(loopback(2, 2, {NODAL_TEST_MULTINODE_PROGRAM, "p2p_kill", "3"}), {}, 60s);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 137) << r.out << r.err;
  std::smatch m;
  // Each rank counts from its own exit from a barrier, a few ms apart: a failure seen at once can
  // show as "-1 ms" (one CI run).
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"(rank 0: PeerFailure (-?\d+) ms after the kill)"))) << r.out;
  EXPECT_LT(std::stoi(m[1]), 5000) << m[0];
  EXPECT_NE(r.out.find("rank 3 on node 1 ("), std::string::npos) << r.out;
}

TEST(MultiNode, TheFailingNodesReportNamesGlobalRanks) {
  // MPMD: each node its own --report file; node 1's rank 3 (local rank 1) is killed. Node 1
  // writes its report before it ends the job (node 0 may be killed by then).
  nodal::testing::TempDir dir("nodal-multinode-report");
  auto node = [&](int k) {
    return std::vector<std::string>{"-n", "1", NODAL_TEST_NODALRUN, "-n", "2", "--report",
                                    dir / ("node" + std::to_string(k) + ".json"), NODAL_TEST_MULTINODE_PROGRAM,
                                    "kill", "3"};
  };
  std::vector<std::string> argv = {NODAL_TEST_MPIRUN, "--oversubscribe", "--mca", "btl", "tcp,self", "--bind-to", "none"};
  for (const std::string& word : node(0)) argv.push_back(word);
  argv.push_back(":");
  for (const std::string& word : node(1)) argv.push_back(word);
  ChildResult r = run_job(argv, {}, 60s);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 137) << r.out << r.err;
  const boost::json::object report = boost::json::parse(nodal::testing::read_file(dir / "node1.json")).as_object();
  EXPECT_EQ(report.at("world_size").as_int64(), 4);
  EXPECT_EQ(report.at("local_world_size").as_int64(), 2);
  EXPECT_EQ(report.at("first_rank").as_int64(), 2);
  EXPECT_EQ(report.at("failure").at("rank").as_int64(), 3) << boost::json::serialize(report);
  const boost::json::array& ranks = report.at("ranks").as_array();
  ASSERT_EQ(ranks.size(), 2u);
  for (std::size_t j = 0; j < 2; ++j) {
    EXPECT_EQ(ranks[j].at("rank").as_int64(), static_cast<std::int64_t>(2 + j));
    EXPECT_EQ(ranks[j].at("local_rank").as_int64(), static_cast<std::int64_t>(j));
  }
}

/// The pid of the nodalrun whose environment says it is mpirun's rank `node` and that runs `word`.
pid_t nodalrun_of_node(int node, const std::string& word) {
  for (pid_t pid : nodal::testing::survivors_mentioning(word, 0ms)) {
    const std::string args = nodal::testing::read_proc_file(pid, "cmdline");
    if (args.find("nodalrun") == std::string::npos) continue;
    const std::string all = nodal::testing::read_proc_file(pid, "environ");
    if (all.find(std::string("OMPI_COMM_WORLD_RANK=") + std::to_string(node) + '\0') != std::string::npos) return pid;
  }
  return -1;
}

TEST(MultiNode, AFrozenNodeFailsTheJobWithinTheNodeTimeout) {
  // A node that stops answering (here its nodalrun is SIGSTOPped: no heartbeats, no steps) is
  // lost after NODAL_NODE_TIMEOUT; the other node's waiting rank gets PeerFailure.
  std::vector<std::string> env = {"NODAL_NODE_TIMEOUT=2"};
  env.insert(env.end(), kRootEnv.begin(), kRootEnv.end());
  ChildProcess job(loopback(2, 1, {NODAL_TEST_MULTINODE_PROGRAM, "loop", "frozen-node-test"}), env);
  ASSERT_TRUE(job.wait_for_output([](const std::string& out, const std::string&) {
    return nodal::testing::count_lines(out, "looping") == 2;
  }, 60s)) << job.out();
  const pid_t node1 = nodalrun_of_node(1, "frozen-node-test");
  ASSERT_GT(node1, 0);
  const auto frozen = std::chrono::steady_clock::now();
  ::kill(node1, SIGSTOP);
  ChildResult r = job.wait(60s);
  ::kill(node1, SIGCONT);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - frozen).count();
  EXPECT_FALSE(r.timed_out);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("rank 0: PeerFailure after"), std::string::npos) << r.out << r.err;
    EXPECT_NE(r.err.find("was lost: nothing heard from it for 2 s (NODAL_NODE_TIMEOUT)"), std::string::npos) << r.err;
  EXPECT_LT(seconds, 15) << r.err;
}

/// The network-namespace cluster, when this machine can build one (root).
class NetnsCluster : public ::testing::Test {
 protected:
  void SetUp() override {
    if (nodal::testing::run({"/bin/bash", NODAL_TEST_NETNS_CLUSTER, "available"}, 30s).exit_code != 0) {
      GTEST_SKIP() << "network namespaces are not available here (needs root); the loopback tests cover the rest";
    }
    ChildResult up = nodal::testing::run({"/bin/bash", NODAL_TEST_NETNS_CLUSTER, "up", "2"}, 60s);
    ASSERT_EQ(up.exit_code, 0) << up.out << up.err;
    ChildResult args = nodal::testing::run({"/bin/bash", NODAL_TEST_NETNS_CLUSTER, "mpirun-args", "2"}, 30s);
    std::istringstream words(args.out);
    for (std::string w; words >> w;) mpirun_args_.push_back(w);
  }
  void TearDown() override { nodal::testing::run({"/bin/bash", NODAL_TEST_NETNS_CLUSTER, "down"}, 60s); }

  std::vector<std::string> job(int ranks, std::vector<std::string> program) const {
    std::vector<std::string> argv = {NODAL_TEST_MPIRUN};
    argv.insert(argv.end(), mpirun_args_.begin(), mpirun_args_.end());
    argv.insert(argv.end(), {"-n", "2", NODAL_TEST_NODALRUN, "-n", std::to_string(ranks)});
    argv.insert(argv.end(), program.begin(), program.end());
    return argv;
  }
  std::vector<std::string> mpirun_args_;
};

TEST_F(NetnsCluster, CollectivesOverTcpBetweenNamespaces) {
  ChildResult r = run_job(job(2, {NODAL_TEST_COLL_PROGRAM, "matrix", "sizes=4,100000"}));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  ChildResult single = nodal::testing::run({NODAL_TEST_NODALRUN, "-n", "4", NODAL_TEST_COLL_PROGRAM, "matrix", "sizes=4,100000"});
  EXPECT_EQ(digests(r.out), digests(single.out)) << r.out << single.out;
  ChildResult env = run_job(job(1, {NODAL_TEST_MULTINODE_PROGRAM, "env"}));
  EXPECT_EQ(env.exit_code, 0) << env.out << env.err;
  // MASTER_ADDR is node 0's host, and MASTER_PORT a port free there.
  EXPECT_TRUE(std::regex_search(env.out, std::regex(R"(\[1\] rank=1 world=2 local=0/1 group=1/2 node=1/2 master=nodal-n1:[1-9][0-9]* )")))
      << env.out;
  // Each namespace has a host name of its own, but the nodes share this machine's cores.
  if (std::thread::hardware_concurrency() >= 2) expect_ranks_on_different_cores(env.out);
}

TEST_F(NetnsCluster, ALinkDownFailsTheJobWithinTheNodeTimeout) {
  std::vector<std::string> env = {"NODAL_NODE_TIMEOUT=2"};
  env.insert(env.end(), kRootEnv.begin(), kRootEnv.end());
  ChildProcess running(job(1, {NODAL_TEST_MULTINODE_PROGRAM, "loop"}), env);
  ASSERT_TRUE(running.wait_for_output([](const std::string& out, const std::string&) {
    return nodal::testing::count_lines(out, "looping") == 2;
  }, 60s)) << running.out();
  const auto down = std::chrono::steady_clock::now();
  nodal::testing::run({"/bin/bash", NODAL_TEST_NETNS_CLUSTER, "link", "2", "down"}, 30s);
  // Node 0's rank fails within the timeout (plus a heartbeat period); mpirun itself cannot reach
  // node 2's daemon any more and may hang: the test takes the output and lets TearDown end it.
  ASSERT_TRUE(running.wait_for_output([](const std::string& out, const std::string&) {
    return out.find("rank 0: PeerFailure after") != std::string::npos;
  }, 30s)) << running.out();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - down).count();
  EXPECT_LT(seconds, 6) << running.out();
}

/// A real Slurm cluster (tests/support/slurm-cluster.sh: slurmctld and one slurmd per network
/// namespace, PMIx), when this machine can build one (root, Debian's Slurm packages); brought up
/// once per test process (ctest runs each test in its own, under a second). srun starts one
/// nodalrun per node, as on a real cluster.
class SlurmCluster : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ChildResult available = nodal::testing::run({"/bin/bash", NODAL_TEST_SLURM_CLUSTER, "available"}, 30s);
    if (available.exit_code != 0) {
      skip_ = "no Slurm cluster here: " + available.err;
      return;
    }
    ChildResult up = nodal::testing::run({"/bin/bash", NODAL_TEST_SLURM_CLUSTER, "up", "2"}, 90s);
    if (up.exit_code != 0) {
      failed_ = "slurm-cluster.sh up 2 failed:\n" + up.out + up.err;
      return;
    }
    ChildResult env = nodal::testing::run({"/bin/bash", NODAL_TEST_SLURM_CLUSTER, "env"}, 30s);
    conf_ = env.out.substr(0, env.out.find('\n'));
  }
  static void TearDownTestSuite() {
    if (skip_.empty()) nodal::testing::run({"/bin/bash", NODAL_TEST_SLURM_CLUSTER, "down"}, 60s);
  }
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_ << "(the mpirun tests cover the rest)";
    ASSERT_TRUE(failed_.empty()) << failed_;
    ASSERT_TRUE(conf_.starts_with("SLURM_CONF=")) << conf_;
  }

  /// srun's argv for one nodalrun per node on both nodes (`mpi`: srun's --mpi=...).
  static std::vector<std::string> srun(int ranks, std::vector<std::string> program, const char* mpi = "--mpi=pmix") {
    std::vector<std::string> argv = {NODAL_TEST_SRUN, "-N", "2", "--ntasks-per-node=1", mpi, "-K1",
                                     NODAL_TEST_NODALRUN, "-n", std::to_string(ranks)};
    argv.insert(argv.end(), program.begin(), program.end());
    return argv;
  }
  static ChildResult run_srun(const std::vector<std::string>& argv, std::chrono::milliseconds timeout = 120s) {
    return run_job(argv, {conf_}, timeout);
  }

  static inline std::string skip_, failed_, conf_;
};

TEST_F(SlurmCluster, SrunStartsOneAgentPerNodeAndRanksFollowTorchrunsRule) {
  ChildResult r = run_srun(srun(2, {NODAL_TEST_MULTINODE_PROGRAM, "env"}));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  // Node k is the namespace nodal-s(k+1), whose hostname is node 0's MASTER_ADDR; each rank is a
  // Slurm task of its own (SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS), and no PMIX_* reaches it.
  for (int rank = 0; rank < 4; ++rank) {
    const std::regex expected("\\[" + std::to_string(rank) + "\\] rank=" + std::to_string(rank) + " world=4 local=" +
                              std::to_string(rank % 2) + "/2 group=" + std::to_string(rank / 2) + "/2 node=" +
                              std::to_string(rank / 2) + "/2 master=nodal-s1:[1-9][0-9]* cpus=\\S+ launcher_vars=0 slurm=" +
                              std::to_string(rank) + "/" + std::to_string(rank % 2) + "/4\n");
    EXPECT_TRUE(std::regex_search(r.out, expected)) << "rank " << rank << ":\n" << r.out;
  }
}

TEST_F(SlurmCluster, CollectivesGiveTheOneNodeBits) {
  const std::vector<std::string> matrix = {NODAL_TEST_COLL_PROGRAM, "matrix", "sizes=4,100000"};
  ChildResult r = run_srun(srun(2, matrix), 180s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  std::vector<std::string> one_node = {NODAL_TEST_NODALRUN, "-n", "4"};
  one_node.insert(one_node.end(), matrix.begin(), matrix.end());
  ChildResult single = nodal::testing::run(one_node, 120s);
  ASSERT_EQ(single.exit_code, 0) << single.out << single.err;
  EXPECT_EQ(nodal::testing::count_lines(r.out, "algorithms private:across_nodes="), 4) << r.out;
  EXPECT_EQ(digests(r.out).size(), 4u) << r.out;
  EXPECT_EQ(digests(r.out), digests(single.out)) << "under srun:\n" << r.out << "one node:\n" << single.out;
}

TEST_F(SlurmCluster, ARankKilledOnNodeBEndsTheStepNamingIt) {
  const auto start = std::chrono::steady_clock::now();
  ChildResult r = run_srun(srun(2, {NODAL_TEST_MULTINODE_PROGRAM, "kill", "3"}), 60s);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 137) << r.out << r.err;
  EXPECT_NE(r.err.find("rank 3 on node 1 ("), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("the job has failed (rank 3: killed by SIGKILL)"), std::string::npos) << r.out;
  EXPECT_LT(seconds, 20) << r.out << r.err;
}

TEST_F(SlurmCluster, SrunWithoutPmixIsRefusedWithTheCommandToUse) {
  ChildResult r = run_srun(srun(1, {NODAL_TEST_MULTINODE_PROGRAM, "env"}, "--mpi=pmi2"), 60s);
  EXPECT_FALSE(r.timed_out);
  EXPECT_NE(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("srun started 2 nodalruns without PMIx (--mpi=pmi2): the nodes cannot reach each other. Use "
                       "srun -N K --ntasks-per-node=1 --mpi=pmix -K1 nodalrun -n N PROGRAM"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.out.find("rank="), std::string::npos) << "a rank started:\n" << r.out;
}

}  // namespace
