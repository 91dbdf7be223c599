// Which outer launcher started nodalrun, from its environment (multinode/node_launch.hpp).
#include <gtest/gtest.h>

#include <nodal/errors.hpp>

#include <map>
#include <string>

#include "multinode/node_launch.hpp"

namespace {

using nodal::launcher::detect_node_launch;
using nodal::launcher::EnvLookup;

EnvLookup env_of(const std::map<std::string, std::string>& vars) {
  return [vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

std::string usage_error(const std::map<std::string, std::string>& vars) {
  try {
    detect_node_launch(env_of(vars));
  } catch (const nodal::UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(NodeLaunch, NoLauncherOrOneTaskIsOneNode) {
  EXPECT_FALSE(detect_node_launch(env_of({})));
  EXPECT_FALSE(detect_node_launch(env_of({{"OMPI_COMM_WORLD_SIZE", "1"}, {"OMPI_COMM_WORLD_RANK", "0"}})));
  EXPECT_FALSE(detect_node_launch(
      env_of({{"SLURM_STEP_ID", "0"}, {"SLURM_STEP_NUM_TASKS", "1"}, {"SLURM_PROCID", "0"}})));  // srun -n 1
}

TEST(NodeLaunch, MpirunGivesNodeRankAndCount) {
  auto launch = detect_node_launch(env_of({{"OMPI_COMM_WORLD_SIZE", "3"}, {"OMPI_COMM_WORLD_RANK", "2"},
                                           {"PMIX_NAMESPACE", "x"}, {"PMIX_RANK", "2"}}));
  ASSERT_TRUE(launch);
  EXPECT_EQ(launch->launcher, "mpirun");
  EXPECT_EQ(launch->node_rank, 2);
  EXPECT_EQ(launch->nnodes, 3);
}

TEST(NodeLaunch, SrunWithPmixGivesNodeRankAndCount) {
  // As srun -N 2 --ntasks-per-node=1 --mpi=pmix sets them (../shared/research/slurm-local.md).
  auto launch = detect_node_launch(env_of({{"SLURM_STEP_ID", "0"}, {"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_PROCID", "1"},
                                           {"SLURM_MPI_TYPE", "pmix"}, {"PMIX_NAMESPACE", "slurm.pmix.6.0"},
                                           {"PMIX_RANK", "1"}}));
  ASSERT_TRUE(launch);
  EXPECT_EQ(launch->launcher, "srun --mpi=pmix");
  EXPECT_EQ(launch->node_rank, 1);
  EXPECT_EQ(launch->nnodes, 2);
}

TEST(NodeLaunch, ImpossibleLaunchesAreRefusedSayingWhatToDo) {
  // srun without PMIx: the nodalruns could not reach each other.
  EXPECT_NE(usage_error({{"SLURM_STEP_ID", "0"}, {"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_PROCID", "0"}})
                .find("without PMIx (no --mpi): the nodes cannot reach each other. Use srun -N K --ntasks-per-node=1 "
                      "--mpi=pmix"),
            std::string::npos);
  EXPECT_NE(usage_error({{"SLURM_STEP_ID", "0"}, {"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_PROCID", "0"},
                         {"SLURM_MPI_TYPE", "pmi2"}, {"PMI_FD", "5"}})
                .find("(--mpi=pmi2)"),
            std::string::npos);
  EXPECT_NE(usage_error({{"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "2"}}).find("is not below"),
            std::string::npos);
  EXPECT_NE(usage_error({{"OMPI_COMM_WORLD_SIZE", "two"}, {"OMPI_COMM_WORLD_RANK", "0"}}).find("not a count"),
            std::string::npos);
  EXPECT_NE(usage_error({{"PMIX_NAMESPACE", "prte"}, {"PMIX_RANK", "0"}}).find("neither mpirun's nor srun's"),
            std::string::npos);
}

TEST(NodeLaunch, TorchrunFlagsAreCheckedAgainstTheLauncher) {
  nodal::launcher::Options options;
  options.nnodes = 2;
  EXPECT_THROW(nodal::launcher::check_node_options(options, std::nullopt), nodal::UsageError);  // nobody started node 1
  nodal::launcher::NodeLaunch launch{"mpirun", 1, 2};
  EXPECT_NO_THROW(nodal::launcher::check_node_options(options, launch));
  options.node_rank = 0;
  EXPECT_THROW(nodal::launcher::check_node_options(options, launch), nodal::UsageError);
  options.node_rank = 1;
  options.max_restarts = 1;
  EXPECT_THROW(nodal::launcher::check_node_options(options, launch), nodal::UsageError);
}

}  // namespace
