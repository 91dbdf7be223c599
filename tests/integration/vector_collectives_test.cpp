// The v-variants (allgatherv, gatherv, scatterv, alltoallv, reduce_scatterv) under nodalrun: results
// against values computed in the ranks, disagreeing counts as the same UsageError on every rank,
// bad arguments refused on the calling rank.
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "../support/child_process.hpp"
#include "../support/paths.hpp"

namespace nodal::testing {
namespace {

using namespace std::chrono_literals;

const std::string kProgram = NODAL_TEST_VECTOR_PROGRAM;

class VectorCollectives : public ::testing::TestWithParam<int> {};

TEST_P(VectorCollectives, EveryVariantMatchesItsReference) {
  const int n = GetParam();
  ChildResult r = run(nodalrun_command({"-n", std::to_string(n), kProgram, "results"}), 180s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(count_lines(r.out, R"(rank \d+: \d+ checks ok)"), n) << r.out;
}

INSTANTIATE_TEST_SUITE_P(Ranks, VectorCollectives, ::testing::Values(1, 2, 3, 5));

class VectorCollectivesMismatch : public ::testing::TestWithParam<int> {};  // a rank 1 disagrees

TEST_P(VectorCollectivesMismatch, DisagreeingCountsAreTheSameUsageErrorOnEveryRank) {
  const int n = GetParam();
  ChildResult r = run(nodalrun_command({"-n", std::to_string(n), kProgram, "mismatch"}), 60s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(count_lines(r.out, R"(UsageError: allgatherv on communicator 'world': rank 1 passes counts\[0\] = 5 but rank 0 passes 4)"), n)
      << r.out;
  EXPECT_EQ(count_lines(r.out, "UsageError: alltoallv on communicator 'world': rank " + std::to_string(n - 1) +
                                   " sends 2 elements to rank 0, which expects 3"),
            n)
      << r.out;
  EXPECT_EQ(count_lines(r.out, "usable after the mismatches"), n) << r.out;
}

INSTANTIATE_TEST_SUITE_P(Ranks, VectorCollectivesMismatch, ::testing::Values(2, 3, 5));

TEST(VectorCollectivesArguments, AreCheckedOnTheCallingRank) {
  ChildResult r = run(nodalrun_command({"-n", "2", kProgram, "bad_args"}), 60s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(count_lines(r.out, "UsageError at once: allgatherv: counts has 1 entries; communicator 'world' has 2 ranks"), 2)
      << r.out;
  EXPECT_EQ(count_lines(r.out, R"(UsageError at once: alltoallv: a negative count \(-1\))"), 2) << r.out;
}

}  // namespace
}  // namespace nodal::testing
