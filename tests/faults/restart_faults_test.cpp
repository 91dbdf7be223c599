// nodalrun --max-restarts: a failed attempt stops every rank and starts the whole job again, with
// NODAL_RESTART_COUNT / TORCHELASTIC_RESTART_COUNT counting the starts; success after a restart
// is exit 0, running out of restarts is the last failure's code; the report lists every attempt.
// A job interrupted or past its --timeout is not restarted.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>

#include <boost/json/src.hpp>  // Boost.JSON header-only, compiled into this test

#include "../support/child_process.hpp"
#include "../support/paths.hpp"

namespace nodal::testing {
namespace {

using namespace std::chrono_literals;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::string report_path(const std::string& name) {
  return ::testing::TempDir() + "restart-" + name + "." + std::to_string(::getpid()) + ".json";
}

boost::json::object read_report(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return boost::json::parse(text.str()).as_object();
}

TEST(Restarts, AJobThatFailsOnceSucceedsOnItsRestart) {
  const std::string report = report_path("once");
  // Rank 1 fails in the first attempt only.
  ChildResult r = run(nodalrun_command({"-n", "2", "--max-restarts", "3", "--report", report, "sh", "-c",
                                        "echo \"start $NODAL_RESTART_COUNT $TORCHELASTIC_RESTART_COUNT "
                                        "$TORCHELASTIC_MAX_RESTARTS\"; "
                                        "[ \"$RANK\" = 1 ] && [ \"$NODAL_RESTART_COUNT\" = 0 ] && exit 3; exit 0"}));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // Rank 0 of the first attempt may be stopped before it prints.
  EXPECT_TRUE(contains(r.out, "[1] start 0 0 3")) << r.out;
  for (int rank : {0, 1}) EXPECT_TRUE(contains(r.out, "[" + std::to_string(rank) + "] start 1 1 3")) << r.out;
  EXPECT_FALSE(contains(r.out, "start 2")) << "restarted after success: " << r.out;
  EXPECT_TRUE(contains(r.err, "nodalrun: rank 1 (pid")) << r.err;
  EXPECT_TRUE(contains(r.err, "nodalrun: restarting the job (restart 1 of 3)")) << r.err;
  EXPECT_TRUE(contains(r.err, "nodalrun: attempt 1 of at most 4: failed at")) << r.err;
  EXPECT_TRUE(contains(r.err, "nodalrun: attempt 2 of at most 4: succeeded")) << r.err;

  boost::json::object json = read_report(report);
  EXPECT_EQ(json["exit_code"].as_int64(), 0);
  boost::json::array& attempts = json["attempts"].as_array();
  ASSERT_EQ(attempts.size(), 2u);
  boost::json::object& first = attempts[0].as_object();
  EXPECT_EQ(first["kind"].as_string(), "exit");
  EXPECT_EQ(first["rank"].as_int64(), 1);
  EXPECT_EQ(first["exit_code"].as_int64(), 3);
  EXPECT_LE(first["failed_s"].as_double(), attempts[1].as_object()["started_s"].as_double());
  EXPECT_EQ(attempts[1].as_object()["kind"].as_string(), "success");
  std::remove(report.c_str());
}

TEST(Restarts, AJobThatKeepsFailingEndsWithTheLastFailuresCode) {
  const std::string report = report_path("always");
  ChildResult r = run(nodalrun_command({"-n", "2", "--max-restarts", "2", "--report", report, "sh", "-c",
                                        "[ \"$RANK\" = 0 ] && exit $((10 + NODAL_RESTART_COUNT)); sleep 30"}));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 12) << r.err;  // the third attempt's
  EXPECT_EQ(count_lines(r.err, "^nodalrun: restarting the job"), 2) << r.err;
  boost::json::object json = read_report(report);
  boost::json::array& attempts = json["attempts"].as_array();
  ASSERT_EQ(attempts.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(attempts[i].as_object()["exit_code"].as_int64(), 10 + i);
  std::remove(report.c_str());
}

TEST(Restarts, TheJobsTimeoutIsNotRestarted) {
  const auto start = std::chrono::steady_clock::now();
  ChildResult r = run(nodalrun_command({"-n", "1", "--max-restarts", "5", "--timeout", "1", "sleep", "30"}));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 124) << r.err;
  EXPECT_FALSE(contains(r.err, "restarting")) << r.err;
  EXPECT_LT(took, 5.0);
}

TEST(Restarts, AnInterruptedJobIsNotRestarted) {
  ChildProcess job(nodalrun_command({"-n", "2", "--max-restarts", "5", "sh", "-c", "echo up; exec sleep 30"}));
  ASSERT_TRUE(job.wait_for_output([](const std::string& out, const std::string&) { return count_lines(out, "up$") == 2; },
                                  30s));
  job.send_signal(SIGINT);
  ChildResult r = job.wait(30s);
  EXPECT_EQ(r.exit_code, 128 + SIGINT) << r.err;
  EXPECT_FALSE(contains(r.err, "restarting")) << r.err;
}

}  // namespace
}  // namespace nodal::testing
