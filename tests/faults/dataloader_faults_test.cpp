// A DataLoader's trainer killed (SIGKILL, nothing runs in it any more) takes its workers with it,
// by fork and by forkserver, and leaves nothing in /dev/shm.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "../support/child_process.hpp"

namespace nodal::testing {
namespace {

using namespace std::chrono_literals;

/// What is in /dev/shm, but for Open MPI's segments (vader_segment.*), which the MPI and
/// multi-node tests running beside this one make and remove.
std::set<std::string> shm_entries() {
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = entry.path().filename();
    if (!name.starts_with("vader_segment.")) names.insert(name);
  }
  return names;
}

class DataLoaderFaults : public ::testing::TestWithParam<std::string> {};

TEST_P(DataLoaderFaults, AKilledTrainerTakesItsWorkersWithIt) {
  const std::set<std::string> before = shm_entries();
  ChildProcess trainer({NODAL_TEST_DATALOADER_PROGRAM, GetParam()});
  ASSERT_TRUE(trainer.wait_for_output(
      [](const std::string& out, const std::string&) { return out.find('\n') != std::string::npos; }, 30s))
      << trainer.out();
  std::istringstream words(trainer.out());
  std::string label;
  pid_t workers[2] = {-1, -1};
  words >> label >> workers[0] >> workers[1];
  ASSERT_EQ(label, "workers") << trainer.out();
  for (pid_t pid : workers) ASSERT_TRUE(process_exists(pid, false)) << pid;
  trainer.send_signal(SIGKILL);
  trainer.wait(10s);
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  for (pid_t pid : workers) {
    while (process_exists(pid, false) && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(10ms);
    EXPECT_FALSE(process_exists(pid, false)) << "worker " << pid << " outlived its trainer";
  }
  EXPECT_EQ(shm_entries(), before) << "something was left in /dev/shm";
}

INSTANTIATE_TEST_SUITE_P(StartMethods, DataLoaderFaults, ::testing::Values("fork", "forkserver"));

}  // namespace
}  // namespace nodal::testing
