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
            "--ranks-per-gpu 0: must be at least 1");
  EXPECT_EQ(usage_error({"-n", "2", "--gpus", "0", "--ranks-per-gpu", "-3", "prog"}),
            "--ranks-per-gpu -3: must be at least 1");
  EXPECT_NE(usage_error({"-n", "2", "--gpus", "0", "--ranks-per-gpu", "two", "prog"}), "");
  EXPECT_EQ(usage_error({"-n", "2", "prog", "--ranks-per-gpu", "0"}), "");  // the program's flags
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

}  // namespace
}  // namespace nodal::launcher
