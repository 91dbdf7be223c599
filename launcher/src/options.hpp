// What the nodalrun command line asks for.
#pragma once

#include <nodal/arena.hpp>

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace nodal::launcher {

enum class StartMethod { spawn, forkserver };
enum class BindTo { automatic, none, core, numa };
/// What nodalrun does once --stall-timeout finds the job stalled, after printing what each rank waits for.
enum class StallAction { fail, report };
/// --mpi: the MPI wire-up protocols the ranks are offered (pmi/mpi_wireup.hpp); automatic: both.
enum class MpiSupport { automatic, pmi1, pmix, none };

/// The most ranks one nodalrun starts; beyond it a typo (-n 10000) is likelier than intent.
inline constexpr int kMaxRanks = 1024;
/// The most --max-restarts: more restarts of a failing job than this are a loop, not resilience.
inline constexpr int kMaxRestarts = 1000;

struct Options {
  int nprocs = 0;
  StartMethod start_method = StartMethod::spawn;
  BindTo bind_to = BindTo::automatic;
  /// -x NAME[=VALUE]: extra environment for every rank (NAME alone passes nodalrun's own value).
  std::vector<std::string> exports;
  std::optional<std::string> output_dir;
  std::optional<std::string> report_path;
  double timeout_seconds = 0;  ///< 0: none
  double grace_seconds = 5;
  /// The job arena's size: an upper bound, reserved page by page as ranks allocate.
  std::size_t shm_size = std::size_t{1} << 30;
  ShmStrategy shm_strategy = ShmStrategy::file_descriptor;
  std::string shm_dir = "/dev/shm";  ///< where the file_system strategy puts the arena
  /// --gpus all|LIST: the CUDA devices to share out among the ranks (see gpu_assignment.hpp);
  /// unset: the ranks get nodalrun's own CUDA_VISIBLE_DEVICES, and no NODAL_DEVICE.
  std::optional<std::string> gpus;
  int ranks_per_gpu = 1;  ///< --ranks-per-gpu: consecutive ranks sharing one GPU (needs --gpus)
  bool mps = false;       ///< --mps: the job's own CUDA MPS control daemon (mps.hpp; needs --gpus)
  /// --stall-timeout SECONDS: 0 none. A job in which no rank has made progress in a nodal call for
  /// this long while one waits is stalled (a deadlock, or a rank that never calls in).
  double stall_timeout_seconds = 0;
  /// --stall-action fail|report: fail the job (exit 125) or only report the stall and go on.
  /// Given without --stall-timeout it is a usage error.
  StallAction stall_action = StallAction::fail;
  /// --max-restarts N (0 to kMaxRestarts): a failed job is stopped and started again up to N times.
  int max_restarts = 0;
  bool verbose = false;  ///< --verbose, -v: print the set-up steps with their timings
  /// --mpi auto|pmi1|pmix|none: serve MPI programs' wire-up (spawn start method only: an MPI
  /// program is exec'd per rank; auto is none under forkserver, pmi1 and pmix a usage error).
  MpiSupport mpi = MpiSupport::automatic;
  /// torchrun's --nnodes, --node-rank, --master-addr: accepted and checked against what the outer
  /// launcher says (multinode/node_launch.hpp); nodalrun never starts other nodes itself.
  std::optional<int> nnodes;
  std::optional<int> node_rank;
  std::optional<std::string> master_addr;
  /// Set by nodalrun itself in multi-node mode (not flags): the global rank of its local rank 0,
  /// the job's world size (every node's ranks), and how its node is named in reports ("node 1
  /// (host)"); on one node 0, nprocs and empty.
  int first_rank = 0;
  std::optional<int> world_size;
  std::string node_label;
  /// The job's rank of this node's local rank `local` (`local` -1, no rank to blame: -1).
  int global_rank(int local) const { return local >= 0 ? first_rank + local : -1; }
  /// PROGRAM then its ARGS; PROGRAM as given (resolve_program finds it on PATH).
  std::vector<std::string> command;
};

/// Parses argv (CLI11). Returns nullopt after printing help or the version (exit 0).
/// Throws UsageError with one line that says what is wrong (the caller exits 2).
std::optional<Options> parse_command_line(int argc, char** argv);

/// Finds PROGRAM as execvp would (PATH search unless it has a '/').
/// Throws ProgramError carrying 127 (not found) or 126 (not executable) and a one-line message.
std::string resolve_program(const std::string& program);

}  // namespace nodal::launcher
