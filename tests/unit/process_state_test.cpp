// process_alive and process_exited (nodal/detail/posix.hpp): a running child, a zombie, a reaped
// child. A waiter tells a slow peer from a dead one by them (locks' holders; a rank leaving a
// collective part-way, shm/call.hpp leave_part_way).
#include <gtest/gtest.h>

#include <nodal/detail/posix.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

namespace nodal::detail {
namespace {

using namespace std::chrono_literals;

TEST(ProcessState, RunningZombieAndReaped) {
  const pid_t child = ::fork();
  if (child == 0) {
    ::pause();
    ::_exit(0);
  }
  ASSERT_GT(child, 0);
  EXPECT_TRUE(process_alive(child));
  EXPECT_FALSE(process_exited(child));

  ASSERT_EQ(::kill(child, SIGKILL), 0);
  // Not reaped: a zombie, which process_alive counts and process_exited does not.
  siginfo_t info{};
  ASSERT_EQ(::waitid(P_PID, static_cast<id_t>(child), &info, WEXITED | WNOWAIT), 0);
  EXPECT_TRUE(process_alive(child));
  EXPECT_TRUE(process_exited(child));

  ASSERT_EQ(::waitpid(child, nullptr, 0), child);
  EXPECT_FALSE(process_alive(child));
  EXPECT_TRUE(process_exited(child));
}

TEST(ProcessState, NoPidIsNeitherGoneNorExited) {
  EXPECT_TRUE(process_alive(0));
  EXPECT_FALSE(process_exited(0));
  EXPECT_FALSE(process_exited(-1));
  EXPECT_FALSE(process_exited(::getpid()));
}

}  // namespace
}  // namespace nodal::detail
