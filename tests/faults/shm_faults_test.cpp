// Shared memory when things go wrong: dead holders, a killed launcher, too little memory, a dead
// producer. Nothing may leak, nothing may hang, nothing may SIGBUS.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/mount.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <thread>

#include "../support/child_process.hpp"
#include "../support/paths.hpp"

namespace nodal::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// Shared memory the kernel holds now (memfds and tmpfs files), in KiB.
long shmem_kib() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key, unit;
  long value = 0;
  while (meminfo >> key >> value >> unit) {
    if (key == "Shmem:") return value;
  }
  return -1;
}

std::vector<std::string> nodal_files_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().filename().string().rfind("nodal-", 0) == 0) names.push_back(entry.path().string());
  }
  return names;
}

/// Shmem drops back once a job's arena is gone; other tenants of the machine make it noisy, so
/// allow slack far below what the job held (3 ranks x 4 x 32 MiB = 384 MiB).
void expect_memory_returned(long before_kib, long held_kib) {
  long after = shmem_kib();
  for (int i = 0; i < 100 && after - before_kib > 32 * 1024; ++i) {
    std::this_thread::sleep_for(20ms);
    after = shmem_kib();
  }
  EXPECT_LT(after - before_kib, 32 * 1024) << "before " << before_kib << " KiB, held " << held_kib << " KiB, after "
                                             << after << " KiB";
}

class Strategy : public ::testing::TestWithParam<std::string> {};

TEST_P(Strategy, ARankKilledHoldingTensorsLeaksNothing) {
  auto before_files = nodal_files_in("/dev/shm");
  long before = shmem_kib();
  ChildProcess launcher(nodalrun_command({"-n", "3", "--shm-strategy", GetParam(), kShmProgram, "hold_and_die", "32", "1"}));
  ChildResult r = launcher.wait(120s);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r.err;
  EXPECT_TRUE(contains(r.err, "rank 1 (pid")) << r.err;
  EXPECT_TRUE(wait_until_gone(ready_pids(r.out), 1s));
  expect_memory_returned(before, 3 * 4 * 32 * 1024);
  EXPECT_EQ(nodal_files_in("/dev/shm"), before_files);
}

TEST_P(Strategy, SigkillOfTheLauncherLeaksNothing) {
  auto before_files = nodal_files_in("/dev/shm");
  long before = shmem_kib();
  ChildProcess launcher(nodalrun_command({"-n", "3", "--shm-strategy", GetParam(), kShmProgram, "hold_and_die", "32", "-1"}));
  ASSERT_TRUE(launcher.wait_for_output([](const std::string& out, const std::string&) { return ready_pids(out).size() == 3; }, 60s));
  std::vector<pid_t> pids = ready_pids(launcher.out());
  long held = shmem_kib() - before;
  EXPECT_GT(held, 3 * 4 * 32 * 1024 * 9 / 10) << "the job should hold its tensors' pages";
  if (GetParam() == "file_system") {
    EXPECT_EQ(nodal_files_in("/dev/shm").size(), before_files.size() + 1);
  }
  launcher.send_signal(SIGKILL);
  launcher.wait(10s);
  EXPECT_TRUE(wait_until_gone(pids, 5s, /*count_zombies=*/false));
  expect_memory_returned(before, held);
  // The guard removes the named arena once nodalrun is gone.
  for (int i = 0; i < 100 && nodal_files_in("/dev/shm") != before_files; ++i) std::this_thread::sleep_for(20ms);
  EXPECT_EQ(nodal_files_in("/dev/shm"), before_files);
}

INSTANTIATE_TEST_SUITE_P(Shm, Strategy, ::testing::Values("file_descriptor", "file_system"));

TEST(ShmLimits, AnAllocationBeyondShmSizeIsAClearError) {
  ChildResult r = run(nodalrun_command({"-n", "1", "--shm-size", "4M", kShmProgram, "allocate", std::to_string(16 << 20)}));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "ShmError: the shared arena is full: need 16 MiB")) << r.out;
  EXPECT_TRUE(contains(r.out, "raise nodalrun --shm-size")) << r.out;
}

/// A tmpfs of `megabytes` mounted on a fresh directory; unmounted on destruction.
class SmallTmpfs {
 public:
  explicit SmallTmpfs(int megabytes) {
    dir_ = (fs::temp_directory_path() / ("nodal-tmpfs-" + std::to_string(::getpid()))).string();
    fs::create_directories(dir_);
    std::string options = "size=" + std::to_string(megabytes) + "m";
    mounted_ = ::mount("tmpfs", dir_.c_str(), "tmpfs", 0, options.c_str()) == 0;
  }
  ~SmallTmpfs() {
    if (mounted_) ::umount(dir_.c_str());
    fs::remove_all(dir_);
  }
  bool mounted() const { return mounted_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  bool mounted_ = false;
};

TEST(ShmLimits, TooLittleShmAtStartUpIsAClearError) {
  SmallTmpfs tmpfs(8);
  if (!tmpfs.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (needs root): " << tmpfs.dir();
  ChildResult r = run(nodalrun_command({"-n", "2", "--shm-strategy", "file_system", "--shm-dir", tmpfs.dir(),
                                        "--shm-size", "64M", kShmProgram, "allocate", "1024"}));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(contains(r.err, "the shared arena needs 64 MiB but " + tmpfs.dir() + " has 8 MiB")) << r.err;
  EXPECT_EQ(r.out, "") << "no rank may start";
  EXPECT_TRUE(nodal_files_in(tmpfs.dir()).empty());
}

TEST(ShmLimits, ShmTakenAwayAfterStartUpIsAClearErrorNotASigbus) {
  SmallTmpfs tmpfs(8);
  if (!tmpfs.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (needs root): " << tmpfs.dir();
  ChildResult r = run(nodalrun_command({"-n", "1", "--shm-strategy", "file_system", "--shm-dir", tmpfs.dir(),
                                        "--shm-size", "7M", kShmProgram, "squeeze", tmpfs.dir(), std::to_string(3 << 20)}));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "ShmError: need 3 MiB of shared memory for an allocation, but " + tmpfs.dir() + " has"))
      << r.out << r.err;
}

TEST(ShmFaults, AConsumerBlockedInGetGetsPeerFailureWhenTheProducerDies) {
  ChildResult r = run(nodalrun_command({"-n", "2", "--grace", "10", kShmProgram, "peer_failure"}), 60s);
  EXPECT_EQ(r.exit_code, 7) << r.err;
  std::smatch m;
  std::regex line(R"(\[0\] PeerFailure after (\d+) ms: the job has failed \(rank 1: exited with code 7\).*)");
  bool found = false;
  for (const std::string& l : lines_of(r.out)) {
    if (std::regex_match(l, m, line)) {
      found = true;
      // The producer dies 300 ms after start; the consumer must know within ~100 ms of that.
      EXPECT_LT(std::stoi(m[1]), 300 + 100 + 200) << l;
    }
  }
  EXPECT_TRUE(found) << r.out << r.err;
}

}  // namespace
}  // namespace nodal::testing
