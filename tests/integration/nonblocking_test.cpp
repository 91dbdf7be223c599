// The non-blocking collectives (Communicator::i*, Work) under nodalrun: results, call order with
// blocking calls in between, errors at the i-call and at wait, timeouts, a dead peer.
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "../support/child_process.hpp"
#include "../support/paths.hpp"

namespace nodal::testing {
namespace {

using namespace std::chrono_literals;

const std::string kProgram = NODAL_TEST_NONBLOCKING_PROGRAM;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

class NonBlocking : public ::testing::TestWithParam<int> {};

TEST_P(NonBlocking, EveryCallInFlightAtOnceGivesTheBlockingResults) {
  const int n = GetParam();
  ChildResult r = run(nodalrun_command({"-n", std::to_string(n), kProgram, "results"}), 120s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(count_lines(r.out, R"(rank \d+: \d+ checks ok)"), n) << r.out;
}

TEST_P(NonBlocking, AMismatchComesFromWaitOnEveryRankAndTheCommunicatorGoesOn) {
  const int n = GetParam();
  ChildResult r = run(nodalrun_command({"-n", std::to_string(n), kProgram, "mismatch"}), 60s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(count_lines(r.out, R"(UsageError from wait: collective mismatch)"), n) << r.out;
  EXPECT_EQ(count_lines(r.out, R"(usable after the mismatch)"), n) << r.out;
}

INSTANTIATE_TEST_SUITE_P(Ranks, NonBlocking, ::testing::Values(2, 3, 4));

TEST(NonBlockingErrors, WaitWithATimeoutThrowsAndTheCallGoesOn) {
  ChildResult r = run(nodalrun_command({"-n", "2", kProgram, "timeout"}), 60s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "[0] rank 0: TimeoutError: ")) << r.out;
  EXPECT_TRUE(contains(r.out, "iallreduce on communicator 'world'")) << r.out;
  EXPECT_EQ(count_lines(r.out, R"(completed after all)"), 2) << r.out;
}

TEST(NonBlockingErrors, BadArgumentsThrowFromTheCallItselfAndForkIsRefusedOnceTheThreadRuns) {
  ChildResult r = run(nodalrun_command({"-n", "2", kProgram, "bad_args"}), 60s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(count_lines(r.out, R"(UsageError at once: allgather: the output tensor has 7 elements, expected 16)"), 2)
      << r.out;
  EXPECT_EQ(count_lines(r.out, R"(spawn\(fork\) refused: .*first non-blocking call .* starts its progress thread)"), 2)
      << r.out;
}

TEST(NonBlockingErrors, ADeadPeerIsPeerFailureFromWait) {
  ChildResult r = run(nodalrun_command({"-n", "3", kProgram, "peer_dies"}), 60s);
  EXPECT_EQ(r.exit_code, 137) << r.out << r.err;  // the killed rank's signal
  EXPECT_EQ(count_lines(r.out, R"(PeerFailure from wait)"), 2) << r.out << r.err;
}

}  // namespace
}  // namespace nodal::testing
