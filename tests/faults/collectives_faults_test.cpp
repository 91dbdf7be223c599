// Collectives when a rank dies: the victim dies (SIGKILL, or _Exit) while the ranks are inside a
// collective, or while the others wait for it; every survivor's pending call, and every later
// call, must throw PeerFailure within 100 ms of the death (DESIGN.md "Errors"), and nodalrun must
// exit with the victim's code. coll_program's victim records when it died in a shared Array, so
// survivors measure from the death itself.
#include <gtest/gtest.h>
#include <signal.h>

#include <map>
#include <ostream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "../support/child_process.hpp"
#include "../support/cma.hpp"
#include "../support/paths.hpp"

namespace nodal::testing {
namespace {

using namespace std::chrono_literals;

#if defined(__SANITIZE_ADDRESS__)
constexpr double kPeerFailureLimitMs = 300;  // sanitizers slow every rank down
#else
constexpr double kPeerFailureLimitMs = 100;  // the communicator's contract
#endif

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

struct KillCase {
  std::string name;
  int n;
  int victim;
  std::vector<std::string> args;  ///< coll_program kill options
  int exit_code = 128 + SIGKILL;
  std::string algorithm{};  ///< the one every rank's first call must take (where the case is about it)
};

void PrintTo(const KillCase& c, std::ostream* os) { *os << c.name; }

class RankDies : public ::testing::TestWithParam<KillCase> {};

TEST_P(RankDies, EverySurvivorGetsPeerFailureFast) {
  const KillCase& c = GetParam();
  std::vector<std::string> argv = {"-n",
                                   std::to_string(c.n),
                                   "--timeout",
                                   "90",
                                   "--grace",
                                   "10",
                                   kCollProgram,
                                   "kill",
                                   "victim=" + std::to_string(c.victim)};
  argv.insert(argv.end(), c.args.begin(), c.args.end());
  ChildResult r = run(nodalrun_command(argv), 120s);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, c.exit_code) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "rank " + std::to_string(c.victim) + " (pid")) << "the victim must be named: " << r.err;

  std::regex failure(R"(\[(\d+)\] rank \d+ PeerFailure after (-?[\d.]+) ms in (\w+) call (\d+): (.*))");
  std::regex later(R"(\[(\d+)\] rank \d+ later (\w+) PeerFailure after ([\d.]+) ms)");
  std::map<int, double> after_ms;
  std::map<int, int> later_calls;
  for (const std::string& line : lines_of(r.out)) {
    std::smatch m;
    if (std::regex_match(line, m, failure)) {
      after_ms[std::stoi(m[1])] = std::stod(m[2]);
      EXPECT_FALSE(m[5].str().empty()) << "PeerFailure without a message: " << line;
    } else if (std::regex_match(line, m, later)) {
      later_calls[std::stoi(m[1])] += 1;
      // At once: within one 20 ms wait slice (a waiter looks at the job's failure word once a
      // slice) plus scheduling on a loaded 2-core VM (an ASan run under ctest -j2 measured 26.9).
      EXPECT_LT(std::stod(m[3]), 50.0) << "a later call must fail at once: " << line;
    }
  }
  for (int rank = 0; rank < c.n; ++rank) {
    if (rank == c.victim) continue;
    ASSERT_TRUE(after_ms.count(rank)) << "rank " << rank << " never got PeerFailure:\n" << r.out << r.err;
    EXPECT_GE(after_ms[rank], 0.0) << "rank " << rank << " got PeerFailure before the victim died:\n" << r.out;
    EXPECT_LT(after_ms[rank], kPeerFailureLimitMs) << "rank " << rank << ":\n" << r.out;
    EXPECT_EQ(later_calls[rank], 3) << "rank " << rank << ":\n" << r.out;
  }
  EXPECT_FALSE(after_ms.count(c.victim)) << r.out;
  if (!c.algorithm.empty() && (c.algorithm != "cma" || kernel_allows_cma())) {
    // Every rank whose first call ended before the victim died says which algorithm it took.
    const int said = count_lines(r.out, R"(\] rank \d+ \w+ algorithm )");
    EXPECT_GE(said, 1) << r.out;
    EXPECT_EQ(count_lines(r.out, R"(\] rank \d+ \w+ algorithm )" + c.algorithm + "$"), said) << r.out;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Collectives, RankDies,
    ::testing::Values(
        // Inside a 16 MiB allreduce: 2 ranks (cma: reading the victim's memory), 4 and 8 on 2
        // cores (pipelined).
        KillCase{"large_allreduce_n2", 2, 1, {"what=allreduce", "count=4194304"}, 128 + SIGKILL, "cma"},
        KillCase{"large_allreduce_n4_rank0", 4, 0, {"what=allreduce", "count=4194304"}},
        KillCase{"large_allreduce_n8", 8, 5, {"what=allreduce", "count=4194304"}},
        // Inside 4 MiB reduces on 2 ranks (linear: the root folds out of the peer's ring), the
        // root killed and the peer killed.
        KillCase{"linear_reduce_root_n2", 2, 0, {"what=reduce", "count=1048576"}},
        KillCase{"linear_reduce_peer_n2", 2, 1, {"what=reduce", "count=1048576"}},
        // Inside 128 KiB gathers to rank 0 on 3 ranks (cma: the peers write into the root's
        // output), the root killed and a peer killed.
        KillCase{"gather_root_n3", 3, 0, {"what=gather", "count=32768"}, 128 + SIGKILL, "cma"},
        KillCase{"gather_peer_n3", 3, 2, {"what=gather", "count=32768"}, 128 + SIGKILL, "cma"},
        // Inside the in_place algorithm, reading the victim's arena buffer.
        KillCase{"in_place_allreduce_n4", 4, 2, {"what=allreduce_shared", "count=4194304"}},
        // Inside back-to-back 4-byte allreduces (the small path).
        KillCase{"small_allreduces_n2", 2, 0, {"what=small"}}, KillCase{"small_allreduces_n8", 8, 3, {"what=small"}},
        // Survivors already waiting: in a barrier the victim never enters, in a recv from it.
        KillCase{"pending_barrier_n3", 3, 1, {"what=barrier"}}, KillCase{"pending_recv_n2", 2, 0, {"what=recv"}},
        KillCase{"pending_recv_n4", 4, 3, {"what=recv"}},
        // The victim is the broadcast's root.
        KillCase{"broadcast_root_n3", 3, 0, {"what=broadcast", "count=1048576"}},
        // A victim in one sub-communicator fails the other group too (the job has failed).
        KillCase{"other_subcommunicator_n4", 4, 3, {"what=split", "count=262144"}},
        // An exit, not a signal: nodalrun passes the code on.
        KillCase{"exit_during_allreduce_n3", 3, 1, {"what=allreduce", "count=1048576", "die=exit"}, 3}),
    [](const auto& p) { return p.param.name; });

struct PartWayCase {
  std::string name;
  int n;
  std::string denier;  ///< one rank, or a comma-separated list
  std::string what;
  std::string count;
  std::string syscall;  ///< the copy that fails on the denier
  bool in_place = false;
  bool nonblocking = false;
};

void PrintTo(const PartWayCase& c, std::ostream* os) { *os << c.name; }

class RankLeavesPartWay : public ::testing::TestWithParam<PartWayCase> {};

TEST_P(RankLeavesPartWay, ItsPeersGetPeerFailureNotAHang) {
  // The denier's cma copy fails (EPERM from a seccomp filter it installs) in the middle of a call
  // its peers wait in, and it catches the error and goes on: it must get that Error, every peer
  // PeerFailure naming it and the failed copy (comm_state.hpp mark_comm_broken), and every later
  // call PeerFailure at once. Every call that returns is checked, and a rank that threw overwrites
  // its buffers at once and finds them unchanged 50 ms later: no peer may still read or write them
  // (Call::leave_part_way). The job then ends with 0; before, the peers waited until --timeout.
  if (!kernel_allows_cma()) GTEST_SKIP() << "Yama ptrace_scope is " << yama_ptrace_scope() << ": no cma here";
  const PartWayCase& c = GetParam();
  ChildResult r =
      run(nodalrun_command({"-n", std::to_string(c.n), "--timeout", "60", "-x", "NODAL_CMA=1", "-x", "NODAL_CROWDED=0",
                            kCollProgram, "part_way", "what=" + c.what, "denier=" + c.denier, "count=" + c.count,
                            c.in_place ? "in_place=1" : "in_place=0", c.nonblocking ? "nonblocking=1" : "nonblocking=0"}),
          90s);
  ASSERT_FALSE(r.timed_out);
  if (contains(r.out, "no seccomp")) GTEST_SKIP() << "seccomp filters are not allowed here: " << r.out;
  const std::string why = c.syscall + R"( (to|from) rank \d+ \(pid \d+\) failed: Operation not permitted.*)";
  std::set<int> deniers;
  std::string alternatives;  // "1|2"
  std::stringstream list(c.denier);
  for (std::string item; std::getline(list, item, ',');) {
    deniers.insert(std::stoi(item));
    alternatives += (alternatives.empty() ? "" : "|") + item;
  }
  const std::string left = "communicator 'world' cannot be used any more: rank (" + alternatives + ") left " + c.what +
                           " #\\d+ part-way: " + why;
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  int denier_errors = 0;
  for (int rank = 0; rank < c.n; ++rank) {
    const std::string tag = "\\[" + std::to_string(rank) + "\\] rank " + std::to_string(rank) + " ";
    EXPECT_EQ(count_lines(r.out, tag + "part_way " + c.what + " algorithm cma"), 1) << r.out;
    const int failures = count_lines(r.out, tag + R"(PeerFailure in call \d+: )" + left);
    if (deniers.count(rank)) {
      // Its own error, or (one of several deniers) the mark another denier made first.
      const int errors = count_lines(r.out, tag + R"(Error in call \d+: )" + why);
      EXPECT_EQ(errors + (deniers.size() > 1 ? failures : 0), 1) << r.out;
      denier_errors += errors;
    } else {
      EXPECT_EQ(failures, 1) << r.out;
    }
    EXPECT_EQ(count_lines(r.out, tag + R"(later PeerFailure after [\d.]+ ms: )" + left), 1) << r.out;
  }
  EXPECT_GE(denier_errors, 1) << "the denier that marked the communicator got its own error: " << r.out;
}

INSTANTIATE_TEST_SUITE_P(
    Collectives, RankLeavesPartWay,
    ::testing::Values(
        // A peer of a gather cannot write its block into the root's output: the root waits for it.
        PartWayCase{"gather_peer_n3", 3, "2", "gather", "20011", "process_vm_writev"},
        // Both peers of a gather fail at once: one of them marks the communicator, both leave.
        PartWayCase{"gather_two_peers_n3", 3, "1,2", "gather", "20011", "process_vm_writev"},
        // The root of a reduce cannot read the peers' inputs: they wait for it to be done with them.
        PartWayCase{"reduce_root_n3", 3, "0", "reduce", "20011", "process_vm_readv"},
        // One of two ranks of a 1 MiB allreduce cannot read the other's: the other waits for its
        // reduced block.
        PartWayCase{"allreduce_n2", 2, "1", "allreduce", "262144", "process_vm_readv"},
        // The same through iallreduce: the call fails on the progress thread, Work::wait throws.
        PartWayCase{"iallreduce_n2", 2, "1", "allreduce", "262144", "process_vm_readv", false, true},
        // A peer of a broadcast cannot read the root's buffer, which the other peer reads too: the
        // root must not hand it back (and overwrite it) while that peer still reads it.
        PartWayCase{"broadcast_peer_n3", 3, "2", "broadcast", "20011", "process_vm_readv"},
        // The root of a broadcast cannot write its share into the peers' buffers while they read
        // the rest of its own (shm/cma.cpp run_cma_broadcast): they wait for that share.
        PartWayCase{"broadcast_root_n3", 3, "0", "broadcast", "20011", "process_vm_writev"},
        // 8 MiB in place on 2 ranks (push allreduce): the other rank writes its reduced half into
        // the denier's buffer while the denier leaves.
        PartWayCase{"push_allreduce_n2", 2, "1", "allreduce", "2097152", "process_vm_readv", true}),
    [](const auto& p) { return p.param.name; });

}  // namespace
}  // namespace nodal::testing
