// The job's fd broker: ranks hand each other descriptors through nodalrun, which keeps them
// alive after their publisher exits; waits end in PeerFailure or TimeoutError; without nodalrun
// the process is its own broker.
#include <gtest/gtest.h>

#include <nodal/errors.hpp>
#include <nodal/detail/fd_broker.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <filesystem>
#include <regex>
#include <set>
#include <string>
#include <thread>

#include "../support/child_process.hpp"
#include "../support/paths.hpp"

namespace nodal::testing {
namespace {

using namespace std::chrono_literals;

const std::string kFdProgram = NODAL_TEST_FD_PROGRAM;

int open_fds() {
  int count = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) ++count;
  return count;
}

std::string content_of(int fd) {
  char buf[64] = {};
  ssize_t n = ::pread(fd, buf, sizeof buf, 0);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
}

TEST(FdBroker, EveryRankReadsEveryRanksDescriptorEvenOnePublishedLate) {
  for (const std::string method : {"spawn", "forkserver"}) {
    ChildResult r = run(nodalrun_command({"-n", "4", "--start-method", method, kFdProgram, "exchange"}));
    ASSERT_EQ(r.exit_code, 0) << method << ": " << r.err;
    std::regex from(R"(^\[(\d)\] from (\d): (.*)$)");
    std::regex fds(R"(^\[(\d)\] fds before (\d+) after (\d+)$)");
    std::set<std::pair<int, int>> seen;
    int fd_lines = 0;
    for (const std::string& line : lines_of(r.out)) {
      std::smatch m;
      if (std::regex_match(line, m, from)) {
        EXPECT_EQ(m[3], "rank " + m[2].str()) << line;  // bit-exact
        seen.insert({std::stoi(m[1]), std::stoi(m[2])});
      } else if (std::regex_match(line, m, fds)) {
        EXPECT_EQ(m[2], m[3]) << method << ": a rank leaked descriptors: " << line;
        ++fd_lines;
      } else {
        ADD_FAILURE() << line;
      }
    }
    EXPECT_EQ(seen.size(), 16u) << method;
    EXPECT_EQ(fd_lines, 4) << method;
  }
}

TEST(FdBroker, DescriptorOutlivesItsPublisher) {
  auto dir = std::filesystem::temp_directory_path() / ("nodal-fd-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  ChildResult r = run(nodalrun_command({"-n", "2", kFdProgram, "after_exit", dir.string()}));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("[0] from 1 after its exit: rank 1\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[0] usage error: rank 0: fetch_fd(owner 1, key 8): rank 1 exited without publishing key 8\n"),
            std::string::npos)
      << r.out;
  std::filesystem::remove_all(dir);
}

TEST(FdBroker, WaiterGetsPeerFailureWhenAnotherRankFails) {
  ChildResult r = run(nodalrun_command({"-n", "3", "--grace", "2", kFdProgram, "peer_failure"}));
  EXPECT_EQ(r.exit_code, 5) << r.err;  // the failing rank's code
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"(\[0\] peer failure after (\d+) ms: .*rank 2.*)"))) << r.out;
  long ms = std::stol(m[1]);
  EXPECT_GE(ms, 150);
  EXPECT_LT(ms, 2000);  // ~200 ms plus one 20 ms slice; generous for a loaded 2-core machine
}

TEST(FdBroker, WaiterTimesOut) {
  ChildResult r = run(nodalrun_command({"-n", "2", kFdProgram, "timeout"}));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"(\[0\] timeout after (\d+) ms: (.*))"))) << r.out;
  EXPECT_GE(std::stol(m[1]), 150);
  EXPECT_LT(std::stol(m[1]), 1000);
  EXPECT_EQ(m[2], "rank 0: fetch_fd(owner 1, key 42) timed out");
}

// Without nodalrun (no nodal::init here either): the process is rank 0 and its own broker.
TEST(FdBrokerSingleton, KeepsItsOwnDescriptorsAndRefusesOtherRanks) {
  const int before = open_fds();
  int first = ::memfd_create("first", MFD_CLOEXEC);
  ASSERT_EQ(::write(first, "first", 5), 5);
  int second = ::memfd_create("second", MFD_CLOEXEC);
  ASSERT_EQ(::write(second, "second", 6), 6);
  detail::publish_fd(11, first);
  detail::publish_fd(11, second);  // the first stays
  ::close(first);                  // the broker holds its own duplicate
  ::close(second);
  int fetched = detail::fetch_fd(0, 11);
  EXPECT_EQ(content_of(fetched), "first");
  ::close(fetched);
  EXPECT_EQ(open_fds(), before + 1);  // the broker's duplicate, kept for the process's life

  try {
    detail::fetch_fd(1, 11);
    FAIL() << "no throw";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "rank 0: fetch_fd(owner 1, key 11) needs nodalrun: no fd broker in a process started "
                           "without it");
  }
  auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(detail::fetch_fd(0, 12, 50ms), TimeoutError);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 50ms);
}

TEST(FdBrokerSingleton, FetchWaitsForAnotherThreadsPublication) {
  std::thread publisher([] {
    std::this_thread::sleep_for(50ms);
    int fd = ::memfd_create("late", MFD_CLOEXEC);
    ASSERT_EQ(::write(fd, "late", 4), 4);
    detail::publish_fd(13, fd);
    ::close(fd);
  });
  int fetched = detail::fetch_fd(0, 13, 10s);
  EXPECT_EQ(content_of(fetched), "late");
  ::close(fetched);
  publisher.join();
}

}  // namespace
}  // namespace nodal::testing
