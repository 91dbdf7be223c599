// Reading the memory cgroup's OOM kill count, v1 and v2.
#include <gtest/gtest.h>

#include "cgroup.hpp"

namespace nodal::launcher {
namespace {

TEST(Cgroup, ParsesOomKillFromBothVersions) {
  EXPECT_EQ(parse_oom_kill("low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n"), 2);  // v2 memory.events
  EXPECT_EQ(parse_oom_kill("oom_kill_disable 0\nunder_oom 0\noom_kill 7\n"), 7);                // v1 memory.oom_control
  EXPECT_EQ(parse_oom_kill("oom_kill_disable 0\nunder_oom 0\n"), -1);                           // kernels before 4.13
  EXPECT_EQ(parse_oom_kill(""), -1);
}

TEST(Cgroup, FindsTheCounterFileOfEachHierarchy) {
  EXPECT_EQ(oom_counter_paths("0::/user.slice/job\n"),
            std::vector<std::string>{"/sys/fs/cgroup/user.slice/job/memory.events"});
  EXPECT_EQ(oom_counter_paths("0::/\n"), std::vector<std::string>{"/sys/fs/cgroup/memory.events"});
  EXPECT_EQ(oom_counter_paths("5:cpu:/x\n4:memory:/process_api/abc\n0::/\n"),
            (std::vector<std::string>{"/sys/fs/cgroup/memory/process_api/abc/memory.oom_control",
                                      "/sys/fs/cgroup/memory.events"}));
}

}  // namespace
}  // namespace nodal::launcher
