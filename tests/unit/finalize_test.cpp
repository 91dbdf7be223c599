// nodal::finalize() (runtime/include/nodal/detail/finalize.hpp), on the CPU path: the order that
// lets GPU backends go before CUDA's teardown, once only, and what a program may do afterwards.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../support/child_process.hpp"
#include "../support/paths.hpp"

namespace nodal::testing {
namespace {

const std::string kFinalizeProgram = NODAL_TEST_FINALIZE_PROGRAM;

TEST(Finalize, AtExitTheHooksRunOnceBeforeStaticDestructorsOfEarlierObjects) {
  const ChildResult r = run({kFinalizeProgram, "at_exit"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  // Reverse order of registration, once, after main returned, before the static made earlier.
  EXPECT_EQ(lines_of(r.out), (std::vector<std::string>{"main returns", "hook 2", "hook 1", "static destructor"}))
      << r.out << r.err;
}

TEST(Finalize, ExplicitlyOnceThenGpuCallsAreRefusedAndCpuCallsWork) {
  const ChildResult r = run(nodalrun_command({"-n", "2", kFinalizeProgram, "explicit"}));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string p = "[" + std::to_string(rank) + "] ";
    std::vector<std::string> mine;
    for (const std::string& line : lines_of(r.out))
      if (line.rfind(p, 0) == 0) mine.push_back(line.substr(p.size()));
    ASSERT_EQ(mine.size(), 7u) << r.out;
    EXPECT_EQ(mine[0], "finalized before: 0");
    EXPECT_EQ(mine[1], "hook 3");  // hook 2 threw: reported, and hook 1 still ran
    EXPECT_EQ(mine[2], "hook 1");
    EXPECT_EQ(mine[3], "finalized after: 1");
    EXPECT_EQ(mine[4], "late hook runs at once");
    EXPECT_EQ(mine[5], "cuda barrier after finalize: UsageError: communicator 'world': a call on cuda tensors after "
                       "nodal::finalize() (it released the GPU backends; call it once the last GPU collective has "
                       "returned)");
    EXPECT_EQ(mine[6], "cpu allreduce after finalize: 3");
  }
  EXPECT_NE(r.err.find("nodal::finalize: a release failed: hook 2 fails"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace nodal::testing
