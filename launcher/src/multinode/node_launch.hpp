// Whether nodalrun runs as one node's agent of a job that spans nodes, from what the outer
// launcher put in its environment. Outer launchers: Open MPI's mpirun (OMPI_COMM_WORLD_*) and
// Slurm's srun --mpi=pmix (SLURM_* with PMIX_*); each starts one nodalrun per node, and nodalrun
// never starts remote processes itself (DESIGN.md "Multi-node"; research: srun -K1 and mpirun
// end a step whose task fails).
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "options.hpp"

namespace nodal::launcher {

struct NodeLaunch {
  std::string launcher;  ///< "mpirun", "srun --mpi=pmix": for messages
  int node_rank = 0;     ///< this agent's index among the agents
  int nnodes = 1;        ///< agents (nodes) in the job
};

/// Looks a variable up: std::getenv in nodalrun, a map in the tests.
using EnvLookup = std::function<const char*(const char*)>;

/// The node this nodalrun is, or nullopt when it runs alone (no outer launcher, or one that
/// started a single nodalrun: then it is the usual one-node nodalrun). Throws UsageError for a
/// launch that cannot work: srun with several tasks but without --mpi=pmix (no way to reach the
/// other nodes), a launcher's rank outside its size. Two agents on one host are two nodes.
std::optional<NodeLaunch> detect_node_launch(const EnvLookup& env);

/// Checks torchrun's --nnodes / --node-rank against the launcher's values (`launch`: nullopt on
/// one node) and the options that do not work across nodes yet (--max-restarts, --mpi pmi1|pmix).
/// Throws UsageError saying which flag disagrees with what.
void check_node_options(const Options& options, const std::optional<NodeLaunch>& launch);

}  // namespace nodal::launcher
