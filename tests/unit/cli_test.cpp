// nodalrun's command line: what it accepts, what it refuses, and how it finds the program.
#include <gtest/gtest.h>

#include <nodal/errors.hpp>

#include <string>
#include <vector>

#include "options.hpp"
#include "program_error.hpp"

namespace nodal::launcher {
namespace {

Options parse(std::vector<std::string> args) {
  args.insert(args.begin(), "nodalrun");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  std::optional<Options> options = parse_command_line(static_cast<int>(argv.size()), argv.data());
  if (!options) throw std::runtime_error("help or version");
  return *options;
}

TEST(CommandLine, DefaultsAndProgramArguments) {
  Options o = parse({"-n", "4", "./train", "--epochs", "3", "-n", "9"});
  EXPECT_EQ(o.nprocs, 4);
  EXPECT_EQ(o.start_method, StartMethod::spawn);
  EXPECT_EQ(o.bind_to, BindTo::automatic);
  EXPECT_EQ(o.grace_seconds, 5);
  EXPECT_EQ(o.timeout_seconds, 0);
  // Everything from PROGRAM on is the program's, even what looks like our flags.
  EXPECT_EQ(o.command, (std::vector<std::string>{"./train", "--epochs", "3", "-n", "9"}));
}

TEST(CommandLine, AllOptions) {
  Options o = parse({"--np", "2", "--start-method", "forkserver", "--bind-to", "numa", "-x", "A=1", "-x", "B",
                     "--output-dir", "/tmp/o", "--report", "/tmp/r.json", "--timeout", "2.5", "--grace", "0.5", "--",
                     "prog", "--flag"});
  EXPECT_EQ(o.nprocs, 2);
  EXPECT_EQ(o.start_method, StartMethod::forkserver);
  EXPECT_EQ(o.bind_to, BindTo::numa);
  EXPECT_EQ(o.exports, (std::vector<std::string>{"A=1", "B"}));
  EXPECT_EQ(o.output_dir, "/tmp/o");
  EXPECT_EQ(o.report_path, "/tmp/r.json");
  EXPECT_DOUBLE_EQ(o.timeout_seconds, 2.5);
  EXPECT_DOUBLE_EQ(o.grace_seconds, 0.5);
  EXPECT_EQ(o.command, (std::vector<std::string>{"prog", "--flag"}));
}

TEST(CommandLine, RefusesBadInputWithUsageError) {
  const std::vector<std::vector<std::string>> bad = {
      {"-n", "0", "prog"},          {"-n", "1025", "prog"},       {"-n", "x", "prog"},
      {"prog"},                     {"-n", "2"},                  {"-n", "2", "--bogus", "prog"},
      {"-n", "2", "--start-method", "fork", "prog"},               {"-n", "2", "--bind-to", "socket", "prog"},
      {"-n", "2", "--timeout", "0", "prog"},                       {"-n", "2", "--grace", "-1", "prog"},
      {"-n", "2", "-x", "=VALUE", "prog"},
  };
  for (const auto& args : bad) {
    EXPECT_THROW(parse(args), UsageError) << args[0] << " " << (args.size() > 1 ? args[1] : "");
  }
}

/// The UsageError's message for these arguments ("" when parsing succeeds).
std::string usage_error(std::vector<std::string> args) {
  try {
    parse(std::move(args));
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(CommandLine, GpusAndRanksPerGpu) {
  Options none = parse({"-n", "2", "prog"});
  EXPECT_FALSE(none.gpus);
  EXPECT_EQ(none.ranks_per_gpu, 1);
  Options all = parse({"-n", "2", "--gpus", "all", "prog"});
  EXPECT_EQ(all.gpus, "all");
  EXPECT_EQ(all.ranks_per_gpu, 1);
  Options list = parse({"-n", "4", "--gpus", "0,1", "--ranks-per-gpu", "2", "prog", "--gpus", "9"});
  EXPECT_EQ(list.gpus, "0,1");  // the list is checked against the machine when the job starts
  EXPECT_EQ(list.ranks_per_gpu, 2);
  EXPECT_EQ(list.command, (std::vector<std::string>{"prog", "--gpus", "9"}));
}

TEST(CommandLine, RanksPerGpuNeedsGpusAndAtLeastOne) {
  EXPECT_EQ(usage_error({"-n", "2", "--ranks-per-gpu", "2", "prog"}), "--ranks-per-gpu needs --gpus");
  EXPECT_EQ(usage_error({"-n", "2", "--gpus", "0", "--ranks-per-gpu", "0", "prog"}),
            "--ranks-per-gpu 0: expected a number of ranks from 1 to 1024");
  EXPECT_EQ(usage_error({"-n", "2", "--gpus", "0", "--ranks-per-gpu", "-3", "prog"}),
            "--ranks-per-gpu -3: expected a number of ranks from 1 to 1024");
  EXPECT_EQ(usage_error({"-n", "2", "prog", "--ranks-per-gpu", "0"}), "");  // the program's flags
}

TEST(CommandLine, StallRestartsAndVerbose) {
  Options none = parse({"-n", "2", "prog"});
  EXPECT_EQ(none.stall_timeout_seconds, 0);
  EXPECT_EQ(none.stall_action, StallAction::fail);
  EXPECT_EQ(none.max_restarts, 0);
  EXPECT_FALSE(none.verbose);
  Options o =
      parse({"-n", "2", "--stall-timeout", "30", "--stall-action", "report", "--max-restarts", "3", "-v", "prog"});
  EXPECT_DOUBLE_EQ(o.stall_timeout_seconds, 30);
  EXPECT_EQ(o.stall_action, StallAction::report);
  EXPECT_EQ(o.max_restarts, 3);
  EXPECT_TRUE(o.verbose);
  EXPECT_TRUE(parse({"-n", "2", "--verbose", "prog"}).verbose);
  EXPECT_EQ(parse({"-n", "2", "--max-restarts", "1000", "prog"}).max_restarts, 1000);
  EXPECT_EQ(usage_error({"-n", "2", "--stall-action", "report", "prog"}), "--stall-action needs --stall-timeout");
}

TEST(CommandLine, ChoicesIgnoreCaseAndTheLastOfARepeatedFlagCounts) {
  Options o = parse({"-n", "1", "-n", "3", "--bind-to", "NUMA", "--shm-strategy", "File_System", "--timeout", "1",
                     "--timeout", "2", "prog"});
  EXPECT_EQ(o.nprocs, 3);
  EXPECT_EQ(o.bind_to, BindTo::numa);
  EXPECT_EQ(o.shm_strategy, ShmStrategy::file_system);
  EXPECT_DOUBLE_EQ(o.timeout_seconds, 2);
  EXPECT_EQ(parse({"-n", "1", "--shm-size", "512M", "prog"}).shm_size, std::size_t{512} << 20);
}

// Every flag's refusal says in words what it takes, never CLI11's "Check foo value in
// {core->2,none->1,numa->3} OR {2,1,3} FAILED" or DBL_MAX printed in full.
TEST(CommandLine, EveryFlagRefusesABadValueInPlainWords) {
  const std::string ranks = "expected a number of ranks from 1 to 1024";
  const std::string positive = "expected a number of seconds > 0 (at most 1e9)";
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"-n", "0"}, "-n 0: " + ranks},
      {{"-n", "1025"}, "-n 1025: " + ranks},
      {{"--np", "x"}, "-n x: " + ranks},
      {{"-n", "2.5"}, "-n 2.5: " + ranks},
      {{"-n", "2", "--start-method", "fork"}, "--start-method fork: expected spawn or forkserver"},
      {{"-n", "2", "--bind-to", "foo"}, "--bind-to foo: expected none, core or numa"},
      {{"-n", "2", "-x", "=VALUE"}, "-x =VALUE: expected NAME or NAME=VALUE"},
      {{"-n", "2", "--output-dir", ""}, "--output-dir '': expected a directory"},
      {{"-n", "2", "--report", ""}, "--report '': expected a file name"},
      {{"-n", "2", "--timeout", "-1"}, "--timeout -1: " + positive},
      {{"-n", "2", "--timeout", "0"}, "--timeout 0: " + positive},
      {{"-n", "2", "--timeout", "nan"}, "--timeout nan: " + positive},
      {{"-n", "2", "--timeout", "inf"}, "--timeout inf: " + positive},
      {{"-n", "2", "--timeout", "1e400"}, "--timeout 1e400: " + positive},
      {{"-n", "2", "--timeout", "2e9"}, "--timeout 2e9: " + positive},
      {{"-n", "2", "--timeout", "5s"}, "--timeout 5s: " + positive},
      {{"-n", "2", "--grace", "-1"}, "--grace -1: expected a number of seconds >= 0 (at most 1e9)"},
      {{"-n", "2", "--grace", "x"}, "--grace x: expected a number of seconds >= 0 (at most 1e9)"},
      {{"-n", "2", "--shm-size", "x"}, "--shm-size x: expected a size > 0 like 4096, 512M or 4G (at most 1P)"},
      {{"-n", "2", "--shm-size", "0"}, "--shm-size 0: expected a size > 0 like 4096, 512M or 4G (at most 1P)"},
      {{"-n", "2", "--shm-strategy", "fd"}, "--shm-strategy fd: expected file_descriptor or file_system"},
      {{"-n", "2", "--shm-dir", ""}, "--shm-dir '': expected a directory"},
      {{"-n", "2", "--gpus", ""}, "--gpus '': expected all or GPU indices like 0,1,3"},
      {{"-n", "2", "--gpus", "0", "--ranks-per-gpu", "two"}, "--ranks-per-gpu two: " + ranks},
      {{"-n", "2", "--stall-timeout", "-5"}, "--stall-timeout -5: " + positive},
      {{"-n", "2", "--stall-timeout", "9", "--stall-action", "kill"}, "--stall-action kill: expected fail or report"},
      {{"-n", "2", "--max-restarts", "-1"}, "--max-restarts -1: expected a number of restarts from 0 to 1000"},
      {{"-n", "2", "--max-restarts", "1001"}, "--max-restarts 1001: expected a number of restarts from 0 to 1000"},
      {{"prog"}, "-n is required: a number of ranks from 1 to 1024"},
  };
  for (const auto& [args, message] : cases) {
    std::vector<std::string> argv = args;
    if (argv.back() != "prog") argv.push_back("prog");
    const std::string error = usage_error(argv);
    EXPECT_EQ(error, message);
    for (const char* noise : {"Check", "FAILED", "17976931348623157", "Could not convert"}) {
      EXPECT_EQ(error.find(noise), std::string::npos) << error;
    }
  }
}

TEST(CommandLine, AFlagWithoutItsValueSaysWhatItExpects) {
  // argv ends where the value should be (a value that is there, even "--grace", is the flag's).
  const std::vector<std::pair<std::string, std::string>> flags = {
      {"--np", "-n without a value: expected a number of ranks from 1 to 1024"},
      {"--start-method", "--start-method without a value: expected spawn or forkserver"},
      {"--bind-to", "--bind-to without a value: expected none, core or numa"},
      {"-x", "-x without a value: expected NAME or NAME=VALUE"},
      {"--output-dir", "--output-dir without a value: expected a directory"},
      {"--report", "--report without a value: expected a file name"},
      {"--timeout", "--timeout without a value: expected a number of seconds > 0 (at most 1e9)"},
      {"--grace", "--grace without a value: expected a number of seconds >= 0 (at most 1e9)"},
      {"--shm-size", "--shm-size without a value: expected a size > 0 like 4096, 512M or 4G (at most 1P)"},
      {"--shm-strategy", "--shm-strategy without a value: expected file_descriptor or file_system"},
      {"--shm-dir", "--shm-dir without a value: expected a directory"},
      {"--gpus", "--gpus without a value: expected all or GPU indices like 0,1,3"},
      {"--ranks-per-gpu", "--ranks-per-gpu without a value: expected a number of ranks from 1 to 1024"},
      {"--stall-timeout", "--stall-timeout without a value: expected a number of seconds > 0 (at most 1e9)"},
      {"--stall-action", "--stall-action without a value: expected fail or report"},
      {"--max-restarts", "--max-restarts without a value: expected a number of restarts from 0 to 1000"},
  };
  for (const auto& [flag, message] : flags) {
    EXPECT_EQ(usage_error({"-n", "2", flag}), message);
  }
  EXPECT_EQ(usage_error({"-n", "2", "--timeout", "--grace", "prog"}),
            "--timeout --grace: expected a number of seconds > 0 (at most 1e9)");
}

TEST(ResolveProgram, FindsOnPathAndClassifiesFailures) {
  EXPECT_EQ(resolve_program("true").substr(resolve_program("true").rfind('/')), "/true");
  EXPECT_EQ(resolve_program("/bin/sh"), "/bin/sh");
  try {
    resolve_program("/no/such/file");
    FAIL() << "no throw";
  } catch (const ProgramError& e) {
    EXPECT_EQ(e.exit_code(), 127);
  }
  try {
    resolve_program("/");
    FAIL() << "no throw";
  } catch (const ProgramError& e) {
    EXPECT_EQ(e.exit_code(), 126);  // a directory exists but cannot be run
  }
}

TEST(CommandLine, MpiWireUp) {
  EXPECT_EQ(parse({"-n", "2", "./a.out"}).mpi, MpiSupport::automatic);
  EXPECT_EQ(parse({"-n", "2", "--mpi", "pmi1", "./a.out"}).mpi, MpiSupport::pmi1);
  EXPECT_EQ(parse({"-n", "2", "--mpi", "none", "./a.out"}).mpi, MpiSupport::none);
  EXPECT_THROW(parse({"-n", "2", "--mpi", "pmi2", "./a.out"}), UsageError);
  // forkserver ranks are forked by nodal::init(), never an MPI program: auto means none there.
  EXPECT_EQ(parse({"-n", "2", "--start-method", "forkserver", "./a.out"}).mpi, MpiSupport::none);
  EXPECT_THROW(parse({"-n", "2", "--start-method", "forkserver", "--mpi", "pmi1", "./a.out"}), UsageError);
}

}  // namespace
}  // namespace nodal::launcher
