#include "multinode/node_launch.hpp"

#include <nodal/errors.hpp>

#include <charconv>
#include <string_view>

#include <fmt/format.h>

namespace nodal::launcher {
namespace {

std::optional<int> read_int(const EnvLookup& env, const char* name) {
  const char* text = env(name);
  if (!text) return std::nullopt;
  int value = 0;
  const std::string_view s(text);
  auto [end, error] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (error != std::errc() || end != s.data() + s.size() || value < 0) {
    throw UsageError(fmt::format("the launcher set {}={}, which is not a count", name, text));
  }
  return value;
}

NodeLaunch checked(NodeLaunch launch, const char* rank_name, const char* size_name) {
  if (launch.nnodes < 1 || launch.node_rank >= launch.nnodes) {
    throw UsageError(fmt::format("{}: {}={} is not below {}={}", launch.launcher, rank_name, launch.node_rank, size_name,
                                 launch.nnodes));
  }
  return launch;
}

}  // namespace

std::optional<NodeLaunch> detect_node_launch(const EnvLookup& env) {
  // Open MPI's mpirun (also under Slurm: mpirun inside an allocation sets these too).
  if (std::optional<int> size = read_int(env, "OMPI_COMM_WORLD_SIZE")) {
    const std::optional<int> rank = read_int(env, "OMPI_COMM_WORLD_RANK");
    if (!rank) throw UsageError("mpirun: OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK is not");
    if (*size <= 1) return std::nullopt;
    return checked({"mpirun", *rank, *size}, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE");
  }
  // A task of a Slurm job step (srun).
  if (env("SLURM_STEP_ID")) {
    const std::optional<int> tasks = read_int(env, "SLURM_STEP_NUM_TASKS");
    const std::optional<int> procid = read_int(env, "SLURM_PROCID");
    if (!tasks || !procid) throw UsageError("srun: SLURM_STEP_ID is set but SLURM_STEP_NUM_TASKS or SLURM_PROCID is not");
    if (*tasks <= 1) return std::nullopt;
    if (!env("PMIX_NAMESPACE")) {
      const char* type = env("SLURM_MPI_TYPE");
      throw UsageError(fmt::format(
          "srun started {} nodalruns without PMIx ({}): the nodes cannot reach each other. Use srun -N K "
          "--ntasks-per-node=1 --mpi=pmix -K1 nodalrun -n N PROGRAM",
          *tasks, type ? fmt::format("--mpi={}", type) : std::string("no --mpi")));
    }
    return checked({"srun --mpi=pmix", *procid, *tasks}, "SLURM_PROCID", "SLURM_STEP_NUM_TASKS");
  }
  if (env("PMIX_NAMESPACE") && env("PMIX_RANK")) {
    throw UsageError("a PMIx launcher started nodalrun, but neither mpirun's nor srun's: nodalrun runs across nodes under "
                     "Open MPI's mpirun or srun --mpi=pmix");
  }
  return std::nullopt;
}

void check_node_options(const Options& options, const std::optional<NodeLaunch>& launch) {
  const int nnodes = launch ? launch->nnodes : 1;
  const int node_rank = launch ? launch->node_rank : 0;
  const std::string by = launch ? launch->launcher : std::string("no outer launcher (one node)");
  if (options.nnodes && *options.nnodes != nnodes) {
    throw UsageError(fmt::format("--nnodes {}: {} started {} nodalrun(s){}", *options.nnodes, by, nnodes,
                                 launch ? std::string()
                                        : std::string("; nodalrun does not start other nodes: run one nodalrun per node "
                                                      "under srun --mpi=pmix or mpirun")));
  }
  if (options.node_rank && *options.node_rank != node_rank) {
    throw UsageError(fmt::format("--node-rank {}: {} says this is node {}", *options.node_rank, by, node_rank));
  }
  if (!launch) return;
  if (options.max_restarts > 0) throw UsageError("--max-restarts does not work across nodes yet");
  if (options.mpi == MpiSupport::pmi1 || options.mpi == MpiSupport::pmix) {
    throw UsageError("--mpi pmi1|pmix: MPI programs as ranks do not run across nodes yet (nodalrun is an MPI process "
                     "itself there)");
  }
}

}  // namespace nodal::launcher
