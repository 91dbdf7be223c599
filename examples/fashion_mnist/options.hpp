// The command line of the Fashion-MNIST job, and the training plan it fixes.
#pragma once

#include <cstdint>
#include <string>

namespace fashion_mnist {

/// Where the failure drill fires: in a trainer, or in its DataLoader's dataset (in a worker).
enum class FailIn { trainer, dataset };

struct Options {
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int epochs = 10;
  int global_batch = 256;  ///< samples per step over all trainers; fixed whatever the trainer count
  int shards = 4;          ///< equal shards of the global batch, a power of two (see trainer.hpp)
  float learning_rate = 0.05F;
  float momentum = 0.9F;
  std::uint64_t seed = 1;
  int num_workers = 1;      ///< DataLoader worker processes per trainer
  int prefetch_factor = 4;  ///< batches each worker may have in flight ahead of its trainer
  std::int64_t train_subset = 0;  ///< train on the first N training samples only (0: all 60000)
  std::int64_t test_subset = 0;   ///< evaluate on the first N test samples only (0: all 10000)
  std::string device = "cpu";  ///< where the gradient allreduce runs: cpu or cuda
  std::string dump_weights;  ///< rank 0 writes the final weights (raw little-endian f32) here
  /// Every this many steps trainer 0 writes `checkpoint`, from which a restarted job (nodalrun
  /// --max-restarts) resumes; 0: no checkpoints (and none read).
  std::int64_t checkpoint_every = 0;
  std::string checkpoint = "fashion_mnist.ckpt";
  // The failure drill: one process throws at a global step, in the job's first attempt only
  // (NODAL_RESTART_COUNT 0 or unset), so that a restarted job runs through.
  std::int64_t fail_at_step = -1;
  int fail_rank = 0;  ///< the trainer rank that fails, or whose dataset does
  FailIn fail_in = FailIn::trainer;
};

/// Parses argv. Prints help or a usage error and exits (0 or 2) when it must; exits 2 with one
/// line saying why for `--device cuda` in a build without CUDA (whether a GPU is there is asked
/// later, by the trainer: CUDA must not be initialised before the DataLoader's fork server starts).
Options parse_options(int argc, char** argv);

}  // namespace fashion_mnist
