#include "options.hpp"

#include <nodal/errors.hpp>
#include <nodal/detail/units.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <iostream>
#include <map>
#include <sstream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "program_error.hpp"

namespace nodal::launcher {

std::optional<Options> parse_command_line(int argc, char** argv) {
  Options options;
  CLI::App app("nodalrun: start N ranks of PROGRAM on this machine and supervise them", "nodalrun");
  app.set_version_flag("--version", "nodalrun 0.1.0");
  app.prefix_command();  // everything from PROGRAM on belongs to the program

  app.add_option("-n,--np,--nproc-per-node", options.nprocs, "number of ranks to start")
      ->required()
      ->check(CLI::Range(1, kMaxRanks));
  const std::map<std::string, StartMethod> start_methods{{"spawn", StartMethod::spawn},
                                                         {"forkserver", StartMethod::forkserver}};
  app.add_option("--start-method", options.start_method,
                 "spawn: fork+exec per rank; forkserver: exec once, nodal::init() forks the ranks")
      ->transform(CLI::CheckedTransformer(start_methods, CLI::ignore_case));
  const std::map<std::string, BindTo> bind_tos{{"none", BindTo::none}, {"core", BindTo::core}, {"numa", BindTo::numa}};
  app.add_option("--bind-to", options.bind_to, "pin each rank to a core or NUMA node (default: core while ranks <= cores)")
      ->transform(CLI::CheckedTransformer(bind_tos, CLI::ignore_case));
  app.add_option("-x", options.exports, "export NAME[=VALUE] to every rank (repeatable)")
      ->allow_extra_args(false);  // one NAME per -x: the program follows
  app.add_option("--output-dir", options.output_dir, "also write rank.<r>.stdout/.stderr files into DIR");
  app.add_option("--report", options.report_path, "write the job's report as JSON to FILE");
  app.add_option("--timeout", options.timeout_seconds, "fail the job (exit 124) after SECONDS")
      ->check(CLI::PositiveNumber);
  app.add_option("--grace", options.grace_seconds, "seconds between SIGTERM and SIGKILL when stopping ranks")
      ->check(CLI::NonNegativeNumber);

  std::string shm_size = "1G";
  app.add_option("--shm-size", shm_size, "the job's shared arena: at most SIZE (e.g. 512M, 4G), reserved as used")
      ->capture_default_str();
  const std::map<std::string, ShmStrategy> strategies{{"file_descriptor", ShmStrategy::file_descriptor},
                                                      {"file_system", ShmStrategy::file_system}};
  app.add_option("--shm-strategy", options.shm_strategy,
                 "file_descriptor (memfd, default): nothing can leak; file_system: a file in --shm-dir others can "
                 "attach by path, removed when the job ends")
      ->transform(CLI::CheckedTransformer(strategies, CLI::ignore_case));
  app.add_option("--shm-dir", options.shm_dir, "directory of the file_system strategy's arena")->capture_default_str();
  app.add_option("--gpus", options.gpus,
                 "all (CUDA_VISIBLE_DEVICES's entries, else every GPU) or LIST (0,1,3): each rank sees them all and "
                 "gets NODAL_DEVICE, its own (rank / --ranks-per-gpu)");
  CLI::Option* ranks_per_gpu =
      app.add_option("--ranks-per-gpu", options.ranks_per_gpu, "consecutive ranks that share one GPU (default 1)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return std::nullopt;
  } catch (const CLI::CallForVersion&) {
    std::cout << "nodalrun 0.1.0\n";
    return std::nullopt;
  } catch (const CLI::ParseError& e) {
    throw UsageError(e.what());
  }
  try {
    options.shm_size = detail::parse_bytes(shm_size);
    if (options.shm_size == 0) throw UsageError("the arena needs at least one byte");
  } catch (const UsageError& e) {
    throw UsageError(fmt::format("--shm-size: {}", e.what()));
  }
  if (ranks_per_gpu->count() > 0 && !options.gpus) throw UsageError("--ranks-per-gpu needs --gpus");
  if (options.ranks_per_gpu < 1) {
    throw UsageError(fmt::format("--ranks-per-gpu {}: must be at least 1", options.ranks_per_gpu));
  }
  options.command = app.remaining();
  if (!options.command.empty() && options.command.front() == "--") options.command.erase(options.command.begin());
  if (options.command.empty()) throw UsageError("no PROGRAM given: nodalrun -n N [options] [--] PROGRAM [ARGS...]");
  if (!options.command.front().empty() && options.command.front()[0] == '-') {
    throw UsageError(fmt::format("unknown option {}", options.command.front()));
  }
  for (const std::string& item : options.exports) {
    if (item.empty() || item.front() == '=') throw UsageError(fmt::format("-x '{}': expected NAME or NAME=VALUE", item));
  }
  return options;
}

std::string resolve_program(const std::string& program) {
  auto check = [](const std::string& path) -> int {  // 0 ok, else the would-be exit code
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return 127;
    if (!S_ISREG(st.st_mode) || ::access(path.c_str(), X_OK) != 0) return 126;  // a directory, or no x bit
    return 0;
  };
  if (program.find('/') != std::string::npos) {
    int code = check(program);
    if (code == 127) throw ProgramError(127, fmt::format("{}: no such file", program));
    if (code == 126) throw ProgramError(126, fmt::format("{}: not executable", program));
    return program;
  }
  const char* path_env = std::getenv("PATH");
  std::stringstream path(path_env ? path_env : "/usr/local/bin:/usr/bin:/bin");
  std::string dir;
  bool found_not_executable = false;
  while (std::getline(path, dir, ':')) {
    std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + program;
    int code = check(candidate);
    if (code == 0) return candidate;
    found_not_executable |= code == 126;
  }
  if (found_not_executable) throw ProgramError(126, fmt::format("{}: not executable", program));
  throw ProgramError(127, fmt::format("{}: command not found on PATH", program));
}

}  // namespace nodal::launcher
