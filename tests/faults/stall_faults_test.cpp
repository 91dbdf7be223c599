// Hang diagnosis: a job whose ranks wait for each other forever is named as such within
// --stall-timeout + 1 s: every rank's line says what it waits in and for whom (or that it runs its
// own code, or exited), the waiting ranks' stacks follow, and nodalrun exits 125 (or only reports,
// --stall-action report). SIGQUIT prints the same table on demand. A slow job that still makes
// calls is not a stall; ranks calling different collectives stay a UsageError.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <boost/json/src.hpp>  // Boost.JSON header-only, compiled into this test

#include "../support/child_process.hpp"
#include "../support/paths.hpp"

namespace nodal::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

const std::string kStallProgram = NODAL_TEST_STALL_PROGRAM;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// The status table's line of `rank` ("nodalrun:   rank 0    pid ..."), empty when missing.
std::string table_line(const std::string& err, int rank) {
  const std::string prefix = "nodalrun:   rank " + std::to_string(rank) + " ";
  for (const std::string& line : lines_of(err)) {
    if (line.rfind(prefix, 0) == 0) return line;
  }
  return {};
}

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + name + "." + std::to_string(::getpid()) + ".json";
}

boost::json::object read_report(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return boost::json::parse(text.str()).as_object();
}

struct Diagnosed {
  ChildResult result;
  double table_after_ready_s = 0;  ///< from every rank's "ready" line to the stall table
};

/// Runs stall_program MODE under nodalrun with `options` and times the stall table's arrival.
Diagnosed run_until_diagnosed(const std::vector<std::string>& options, const std::string& mode, int ranks) {
  std::vector<std::string> argv = {"-n", std::to_string(ranks)};
  argv.insert(argv.end(), options.begin(), options.end());
  argv.insert(argv.end(), {kStallProgram, mode});
  ChildProcess job(nodalrun_command(argv));
  Diagnosed d;
  const bool ready = job.wait_for_output(
      [&](const std::string& out, const std::string&) { return static_cast<int>(ready_ranks(out).size()) == ranks; },
      30s);
  const Clock::time_point ready_at = Clock::now();
  const bool table = job.wait_for_output(
      [](const std::string&, const std::string& err) { return contains(err, "nodalrun: stall:"); }, 30s);
  d.table_after_ready_s = std::chrono::duration<double>(Clock::now() - ready_at).count();
  d.result = job.wait(60s);
  EXPECT_TRUE(ready) << d.result.out << d.result.err;
  EXPECT_TRUE(table) << d.result.err;
  return d;
}

TEST(Stall, ARankThatSkipsAnAllreduceIsNamedWithinTheTimeout) {
  const std::string report = temp_path("skip");
  Diagnosed d = run_until_diagnosed({"--stall-timeout", "2", "--report", report}, "skip-allreduce", 3);
  const ChildResult& r = d.result;
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 125) << r.err;
  EXPECT_LE(d.table_after_ready_s, 2.0 + 1.0) << r.err;
  for (int rank : {0, 1}) {
    const std::string line = table_line(r.err, rank);
    EXPECT_TRUE(contains(line, "waiting")) << line << "\n" << r.err;
    EXPECT_TRUE(contains(line, "in allreduce #3 on communicator 'world' (4 x f32")) << line;
    EXPECT_TRUE(contains(line, "for ranks 2 to make this call")) << line;
  }
  const std::string last = table_line(r.err, 2);
  EXPECT_TRUE(contains(last, "exited")) << last;
  EXPECT_TRUE(contains(last, "with code 0")) << last;
  // The waiting ranks' stacks, symbolised, reach their own call site.
  EXPECT_TRUE(contains(r.err, "stacks of the waiting ranks (2 of their threads answered")) << r.err;
  EXPECT_GE(count_lines(r.err, R"(^\[0\] .*allreduce)"), 1) << r.err;
  EXPECT_GE(count_lines(r.err, R"(^\[1\] .*main)"), 1) << r.err;
  EXPECT_TRUE(contains(r.err, "the job stalled")) << r.err;

  boost::json::object json = read_report(report);
  EXPECT_EQ(json["exit_code"].as_int64(), 125);
  EXPECT_EQ(json["failure"].as_object()["kind"].as_string(), "stall");
  boost::json::object& table = json["wait_table"].as_object();
  EXPECT_GE(table["stalled_for_s"].as_double(), 2.0);
  boost::json::array& rows = table["ranks"].as_array();
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].as_object()["state"].as_string(), "waiting");
  EXPECT_EQ(rows[2].as_object()["state"].as_string(), "exited");
  EXPECT_EQ(table["stacks"].as_array().size(), 2u);
  std::remove(report.c_str());
}

TEST(Stall, AConsumerWhoseProducerIsIdleIsNamedWithinTheTimeout) {
  Diagnosed d = run_until_diagnosed({"--stall-timeout", "1.5"}, "idle-producer", 2);
  const ChildResult& r = d.result;
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 125) << r.err;
  EXPECT_LE(d.table_after_ready_s, 1.5 + 1.0) << r.err;
  const std::string consumer = table_line(r.err, 0);
  EXPECT_TRUE(contains(consumer, "waiting")) << consumer;
  EXPECT_TRUE(contains(consumer, "in TensorQueue 'jobs' get for a put (the queue is empty)")) << consumer;
  const std::string producer = table_line(r.err, 1);
  EXPECT_TRUE(contains(producer, "running")) << producer;
  EXPECT_TRUE(contains(producer, "in its own code (2 nodal calls made)")) << producer;
  EXPECT_GE(count_lines(r.err, R"(^\[0\] .*TensorQueue::get)"), 1) << r.err;
}

TEST(Stall, ARankJoiningAChildThatNeverEndsIsNamed) {
  Diagnosed d = run_until_diagnosed({"--stall-timeout", "1"}, "hung-child", 1);
  const ChildResult& r = d.result;
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 125) << r.err;
  EXPECT_LE(d.table_after_ready_s, 1.0 + 1.0) << r.err;
  const std::string line = table_line(r.err, 0);
  EXPECT_TRUE(contains(line, "waiting")) << line;
  EXPECT_TRUE(contains(line, "in join of 1 child process(es)")) << line;
  EXPECT_TRUE(contains(line, "for 1 of them to exit (pids ")) << line;
  EXPECT_GE(count_lines(r.err, R"(^\[0\] .*nodal::spawn)"), 1) << "the join's stack: " << r.err;
}

TEST(Stall, RanksCallingDifferentCollectivesStayAUsageError) {
  const Clock::time_point start = Clock::now();
  ChildResult r = run(nodalrun_command({"-n", "2", "--stall-timeout", "2", kStallProgram, "mismatch"}), 60s);
  const double took = std::chrono::duration<double>(Clock::now() - start).count();
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "collective mismatch")) << r.err;
  EXPECT_FALSE(contains(r.err, "nodalrun: stall:")) << r.err;
  EXPECT_LT(took, 2.0 + 1.0) << r.err;
}

TEST(Stall, ASlowJobThatStillMakesCallsIsNotAStall) {
  // Rank 1 waits ~300 ms in every allreduce for rank 0, longer than it spins: its waits are in the
  // table, but the heartbeats move, so 1 s of --stall-timeout never fires in 3 s.
  ChildResult r = run(nodalrun_command({"-n", "2", "--stall-timeout", "1", kStallProgram, "progress", "3"}), 60s);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(contains(r.err, "stall")) << r.err;
}

TEST(Stall, ReportOnlyPrintsTheTableOnceAndLetsTheJobRun) {
  ChildResult r = run(nodalrun_command({"-n", "2", "--stall-timeout", "1", "--stall-action", "report", "--timeout",
                                        "4", kStallProgram, "idle-producer"}),
                      60s);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 124) << r.err;  // the job ran on until --timeout
  EXPECT_EQ(count_lines(r.err, "^nodalrun: stall:"), 1) << r.err;
  EXPECT_TRUE(contains(r.err, "reporting only")) << r.err;
  EXPECT_FALSE(contains(r.err, "the job stalled")) << r.err;
}

TEST(Stall, SigquitPrintsTheTableOnDemand) {
  ChildProcess job(nodalrun_command({"-n", "2", kStallProgram, "idle-producer"}));
  ASSERT_TRUE(job.wait_for_output([](const std::string& out, const std::string&) { return ready_ranks(out).size() == 2; },
                                  30s));
  // The consumer goes to sleep in its get after ~50 us of spinning; give it a moment.
  std::this_thread::sleep_for(500ms);
  job.send_signal(SIGQUIT);
  const bool printed = job.wait_for_output(
      [](const std::string&, const std::string& err) { return contains(err, "stacks of the waiting ranks"); }, 10s);
  job.send_signal(SIGTERM);
  ChildResult r = job.wait(30s);
  ASSERT_TRUE(printed) << r.err;
  EXPECT_TRUE(contains(r.err, "nodalrun: status requested (SIGQUIT)")) << r.err;
  EXPECT_TRUE(contains(table_line(r.err, 0), "in TensorQueue 'jobs' get for a put")) << r.err;
  EXPECT_TRUE(contains(table_line(r.err, 1), "running")) << r.err;
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.err;  // asking for the status does not stop the job
}

}  // namespace
}  // namespace nodal::testing
