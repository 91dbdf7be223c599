#include "options.hpp"

#include <nodal/errors.hpp>
#include <nodal/detail/units.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <type_traits>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "pmi/pmix_host.hpp"
#include "program_error.hpp"

namespace nodal::launcher {
namespace {

/// The most seconds a timeout or grace may be (about 32 years): more is a typo, and nanosecond
/// clocks and timers overflow not far beyond (2^63 ns is 292 years).
constexpr double kMaxSeconds = 1e9;
constexpr const char* kMaxSecondsText = "1e9";

/// A whole number from `min` to `max` ("2.5", "4x", "" and out-of-range values are refused).
auto whole_number(int min, int max) {
  return [min, max](const std::string& text) -> std::optional<int> {
    int value = 0;
    auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (error != std::errc() || end != text.data() + text.size() || value < min || value > max) return std::nullopt;
    return value;
  };
}

/// A finite number of seconds, > 0 or (`zero_ok`) >= 0, at most kMaxSeconds ("nan" and "inf" are refused).
auto seconds(bool zero_ok) {
  return [zero_ok](const std::string& text) -> std::optional<double> {
    double value = 0;
    auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (error != std::errc() || end != text.data() + text.size() || !std::isfinite(value)) return std::nullopt;
    if (value < 0 || (value == 0 && !zero_ok) || value > kMaxSeconds) return std::nullopt;
    return value;
  };
}

/// Any text but the empty one (a path, a file name).
std::optional<std::string> non_empty(const std::string& text) {
  return text.empty() ? std::nullopt : std::optional<std::string>(text);
}

/// nodalrun's options that take a value, each refused in the same plain words wherever it goes
/// wrong: "--timeout -1: expected a number of seconds > 0". CLI11's own checks would answer
/// "Check foo value in {core->2,none->1,numa->3} OR {2,1,3} FAILED" or print DBL_MAX in full, so
/// every value comes in as text and is read here.
class ValueOptions {
 public:
  explicit ValueOptions(CLI::App& app) : app_(app) {}

  /// Adds the option `names` ("-n,--np": the first one names it in messages), shown in the help as
  /// `names type`. `read(text)` returns the value to store in `target` (appended to a vector, for
  /// a repeatable option), or nullopt to refuse the text; `expected` says what it accepts.
  template <typename T, typename Read>
  CLI::Option* add(const std::string& names, const std::string& type, T& target, std::string expected,
                   const std::string& help, Read read) {
    using Value = typename std::invoke_result_t<Read, const std::string&>::value_type;
    constexpr bool repeatable = requires { target.push_back(std::declval<Value>()); };
    std::string flag = names.substr(0, names.find(','));
    auto store = [&target, flag, expected, read](const CLI::results_t& texts) {
      for (const std::string& text : texts) {
        std::optional<Value> value = read(text);
        if (!value) throw UsageError(fmt::format("{} {}: expected {}", flag, text.empty() ? "''" : text, expected));
        if constexpr (repeatable) {
          target.push_back(std::move(*value));
        } else {
          target = std::move(*value);
        }
      }
      return true;
    };
    CLI::Option* option = app_.add_option(names, CLI::callback_t(store), help)->type_name(type);
    // Given twice, the last one counts (as with argparse, so torchrun); a repeatable one keeps them all.
    option->multi_option_policy(repeatable ? CLI::MultiOptionPolicy::TakeAll : CLI::MultiOptionPolicy::TakeLast);
    options_.push_back({option, std::move(flag), std::move(expected)});
    return option;
  }

  /// Adds an option whose value is one of `choices` (in any case): "none, core or numa".
  template <typename T>
  CLI::Option* add_choice(const std::string& names, T& target, std::vector<std::pair<std::string, T>> choices,
                          const std::string& help) {
    std::vector<std::string> words;
    for (const auto& choice : choices) words.push_back(choice.first);
    const std::string type = fmt::format("{}", fmt::join(words, "|"));
    std::string expected = words.back();
    if (words.size() > 1) {
      words.pop_back();
      expected = fmt::format("{} or {}", fmt::join(words, ", "), expected);
    }
    return add(names, type, target, std::move(expected), help, [choices](const std::string& text) -> std::optional<T> {
      auto lower = [](char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); };
      for (const auto& [name, value] : choices) {
        if (std::ranges::equal(text, name, {}, lower)) return value;
      }
      return std::nullopt;
    });
  }

  /// CLI11's errors about an option added here, in the same words: argv ending where the value
  /// should be ("--timeout: 1 required TEXT missing"), a required option left out.
  std::string explain(const CLI::ParseError& error) const {
    const std::string what = error.what();
    for (const Added& added : options_) {
      const std::string name = added.option->get_name();
      if (what.rfind(name + ":", 0) == 0 && dynamic_cast<const CLI::ArgumentMismatch*>(&error)) {
        return fmt::format("{} without a value: expected {}", added.flag, added.expected);
      }
      if (what == name + " is required") return fmt::format("{} is required: {}", added.flag, added.expected);
    }
    return what;
  }

 private:
  struct Added {
    const CLI::Option* option;
    std::string flag;      ///< as messages name it
    std::string expected;  ///< what it accepts, in words
  };
  CLI::App& app_;
  std::vector<Added> options_;
};

}  // namespace

std::optional<Options> parse_command_line(int argc, char** argv) {
  Options options;
  CLI::App app("nodalrun: start N ranks of PROGRAM on this machine and supervise them", "nodalrun");
  app.set_version_flag("--version", "nodalrun 0.1.0");
  app.prefix_command();  // everything from PROGRAM on belongs to the program
  ValueOptions values(app);
  const std::string ranks = fmt::format("a number of ranks from 1 to {}", kMaxRanks);
  const std::string positive_seconds = fmt::format("a number of seconds > 0 (at most {})", kMaxSecondsText);

  values
      .add("-n,--np,--nproc-per-node", "N", options.nprocs, ranks, "number of ranks to start",
           whole_number(1, kMaxRanks))
      ->required();
  values.add_choice("--start-method", options.start_method,
                    {{"spawn", StartMethod::spawn}, {"forkserver", StartMethod::forkserver}},
                    "spawn: fork+exec per rank; forkserver: exec once, nodal::init() forks the ranks");
  values.add_choice("--bind-to", options.bind_to,
                    {{"none", BindTo::none}, {"core", BindTo::core}, {"numa", BindTo::numa}},
                    "pin each rank to a core or NUMA node (default: core while ranks <= cores)");
  values
      .add("-x", "NAME[=VALUE]", options.exports, "NAME or NAME=VALUE",
           "export NAME[=VALUE] to every rank (repeatable)",
           [](const std::string& text) -> std::optional<std::string> {
             if (text.empty() || text.front() == '=') return std::nullopt;
             return text;
           })
      ->allow_extra_args(false);  // one NAME per -x: the program follows
  values.add("--output-dir", "DIR", options.output_dir, "a directory",
             "also write rank.<r>.stdout/.stderr files into DIR", non_empty);
  values.add("--report", "FILE", options.report_path, "a file name", "write the job's report as JSON to FILE",
             non_empty);
  values.add("--timeout", "SECONDS", options.timeout_seconds, positive_seconds, "fail the job (exit 124) after SECONDS",
             seconds(false));
  values.add("--grace", "SECONDS", options.grace_seconds,
             fmt::format("a number of seconds >= 0 (at most {})", kMaxSecondsText),
             "seconds between SIGTERM and SIGKILL when stopping ranks", seconds(true));
  values
      .add("--shm-size", "SIZE", options.shm_size, "a size > 0 like 4096, 512M or 4G (at most 1P)",
           "the job's shared arena: at most SIZE (e.g. 512M, 4G), reserved as used",
           [](const std::string& text) -> std::optional<std::size_t> {
             try {
               std::size_t bytes = detail::parse_bytes(text);
               return bytes > 0 ? std::optional<std::size_t>(bytes) : std::nullopt;
             } catch (const UsageError&) {
               return std::nullopt;
             }
           })
      ->default_str("1G");
  values.add_choice("--shm-strategy", options.shm_strategy,
                    {{"file_descriptor", ShmStrategy::file_descriptor}, {"file_system", ShmStrategy::file_system}},
                    "file_descriptor (memfd, default): nothing can leak; file_system: a file in --shm-dir others can "
                    "attach by path, removed when the job ends");
  values
      .add("--shm-dir", "DIR", options.shm_dir, "a directory", "directory of the file_system strategy's arena",
           non_empty)
      ->default_str(options.shm_dir);
  // The list's indices are checked against the machine's GPUs when the job starts (assign_gpus).
  values.add("--gpus", "all|LIST", options.gpus, "all or GPU indices like 0,1,3",
             "all (CUDA_VISIBLE_DEVICES's entries, else every GPU) or LIST (0,1,3): each rank sees them all and "
             "gets NODAL_DEVICE, its own (rank / --ranks-per-gpu)",
             non_empty);
  CLI::Option* ranks_per_gpu =
      values.add("--ranks-per-gpu", "K", options.ranks_per_gpu, ranks,
                 "consecutive ranks that share one GPU (default 1)", whole_number(1, kMaxRanks));
  CLI::Option* mps = app.add_flag("--mps", options.mps,
                                  "start an MPS control daemon of the job's own (nvidia-cuda-mps-control -d, in a "
                                  "fresh directory) so that ranks sharing a GPU run side by side instead of "
                                  "time-slicing it; stopped when the job ends, however nodalrun ends (needs --gpus)");
  CLI::Option* stall_timeout = values.add(
      "--stall-timeout", "SECONDS", options.stall_timeout_seconds, positive_seconds,
      "when no rank has made progress in a nodal call for SECONDS while one waits, print what every rank waits for "
      "and the waiting ranks' stacks, then fail the job (exit 125)",
      seconds(false));
  CLI::Option* stall_action = values.add_choice("--stall-action", options.stall_action,
                                                {{"fail", StallAction::fail}, {"report", StallAction::report}},
                                                "fail (default) or only report the stall and go on");
  values.add("--max-restarts", "N", options.max_restarts,
             fmt::format("a number of restarts from 0 to {}", kMaxRestarts),
             "when a rank fails, stop the job and start it again, up to N times", whole_number(0, kMaxRestarts));
  CLI::Option* mpi = values.add_choice(
      "--mpi", options.mpi,
      {{"auto", MpiSupport::automatic}, {"pmi1", MpiSupport::pmi1}, {"pmix", MpiSupport::pmix},
       {"none", MpiSupport::none}},
      "serve MPI programs' wire-up so their ranks form one job: PMI-1 (MPICH), PMIx (Open MPI), auto (default: "
      "both) or none");
  values.add("--nnodes", "K", options.nnodes, "a number of nodes from 1 to 65536",
             "torchrun's flag: the job's nodes, checked against the launcher that started one nodalrun per node "
             "(srun --mpi=pmix, mpirun)",
             whole_number(1, 65536));
  values.add("--node-rank", "K", options.node_rank, "a node index from 0 to 65535",
             "torchrun's flag: this node's index, checked against the launcher's", whole_number(0, 65535));
  values.add("--master-addr", "HOST", options.master_addr, "a host name or address",
             "torchrun's flag: MASTER_ADDR for every rank (default: node 0's host name); every node must give the "
             "same",
             non_empty);
  app.add_flag("-v,--verbose", options.verbose, "print the set-up steps and their timings");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return std::nullopt;
  } catch (const CLI::CallForVersion&) {
    std::cout << "nodalrun 0.1.0\n";
    return std::nullopt;
  } catch (const CLI::ParseError& e) {
    throw UsageError(values.explain(e));
  }
  if (ranks_per_gpu->count() > 0 && !options.gpus) throw UsageError("--ranks-per-gpu needs --gpus");
  if (mps->count() > 0 && !options.gpus) throw UsageError("--mps needs --gpus");
  if (stall_action->count() > 0 && stall_timeout->count() == 0) {
    throw UsageError("--stall-action needs --stall-timeout");
  }
  if (options.mpi == MpiSupport::pmix && !pmix_built()) {
    throw UsageError("--mpi pmix: this nodalrun was built without libpmix (Debian: libpmix-dev); --mpi pmi1 serves MPICH");
  }
  if (options.start_method == StartMethod::forkserver) {
    if (mpi->count() > 0 && options.mpi != MpiSupport::none && options.mpi != MpiSupport::automatic) {
      throw UsageError(
          "--mpi pmi1|pmix needs --start-method spawn: an MPI program's ranks are exec'd, not forked by "
          "nodal::init()");
    }
    options.mpi = MpiSupport::none;
  }
  options.command = app.remaining();
  if (!options.command.empty() && options.command.front() == "--") options.command.erase(options.command.begin());
  if (options.command.empty()) throw UsageError("no PROGRAM given: nodalrun -n N [options] [--] PROGRAM [ARGS...]");
  if (!options.command.front().empty() && options.command.front()[0] == '-') {
    throw UsageError(fmt::format("unknown option {}", options.command.front()));
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
