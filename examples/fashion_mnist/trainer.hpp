// One trainer rank's share of data-parallel SGD, arranged so that 1, 2 or 4 trainers (any power
// of two dividing --shards) compute bitwise the same weights from the same seed and global batch.
//
// Floating-point addition is not associative, so the weights depend on how the gradient sum is
// grouped; a plain allreduce of per-rank gradients groups it by rank, i.e. differently for each
// trainer count. Here the grouping is fixed by the plan instead:
// - the global batch is cut into `shards` equal shards (4 by default, a power of two); each trainer
//   computes the gradient of each of its shards alone, with the same shard size whatever the
//   trainer count, so Eigen sees the same shapes and sums in the same order (one thread);
// - the shard gradients are summed in one fixed balanced tree, ((g0 + g1) + (g2 + g3)) for 4
//   shards. A trainer's shards are a whole subtree, which it sums locally; the allreduce joins
//   the subtrees of trainers 2j and 2j+1 in row j of a [trainers/2, P] buffer in which each
//   trainer fills only its pair's row and zeros the others: each element then has two terms that
//   are not zero, and x + 0 == x in IEEE arithmetic (negative zeros are made positive first,
//   since -0 + 0 is +0), so in whatever order the allreduce adds (IEEE addition commutes; only
//   its grouping matters) it computes exactly that tree node, the same on every rank; the levels
//   above are summed locally from the rows, in tree order.
// One trainer sums the whole tree itself; two send one gradient each through the allreduce and
// zero nothing; four send two rows of which they zero one. This holds on a GPU too (NCCL or CUDA
// IPC): whatever order a backend adds in, each element has at most two terms that are not zero.
#pragma once

#include <nodal/communicator.hpp>
#include <nodal/data/sample.hpp>
#include <nodal/tensor.hpp>

#include <cstddef>
#include <vector>

#include <Eigen/Core>

#include "mlp.hpp"
#include "options.hpp"
#include "plan.hpp"

namespace fashion_mnist {

/// Seconds one trainer spent in each part of its steps.
struct StepTimes {
  double load = 0;     ///< waiting for batches from the DataLoader's workers
  double compute = 0;  ///< forward, backward, shard sum, SGD update
  double comm = 0;     ///< the gradient allreduce (including waiting for slower trainers)
};

class DataParallelTrainer {
 public:
  /// `comm` holds the trainers only (rank t is trainer t). `device`: where the gradient allreduce
  /// runs (cpu: in the arena; cuda: the rows are copied to that GPU, allreduced there and copied
  /// back; the sums are the same bits, see above).
  DataParallelTrainer(const Plan& plan, const Options& options, nodal::Communicator comm, nodal::Device device);

  /// SGD step `step` (global, from 0) on this trainer's part of the global batch (FashionTrain's:
  /// "image" f32 [local_batch, 784], "label" i32 [local_batch]); returns the global batch's mean
  /// loss (the same on every trainer). Adds its compute and communication time to `times`.
  float step(std::int64_t step, const nodal::data::Batch& batch, StepTimes& times);

  /// The learning rate of global step `step`: cosine decay from --lr to 0 over the run (Loshchilov
  /// and Hutter, "SGDR", 2017, without restarts), which ends training in a flat minimum rather
  /// than bouncing around one.
  float learning_rate(std::int64_t step) const;

  Mlp& model() { return model_; }
  nodal::Communicator& comm() { return comm_; }

 private:
  Plan plan_;
  float learning_rate_;
  float momentum_;
  nodal::Communicator comm_;
  nodal::Device device_;
  Mlp model_;
  // A row: one gradient (Mlp layout), then its mean loss, then padding to a multiple of 64 bytes.
  /// f32 [trainers / 2, row] in the arena (the allreduce then reads peers' rows in place); empty
  /// for one trainer.
  nodal::Tensor pair_rows_;
  /// This trainer's shard gradients, shards_per_trainer() rows; the first is in pair_rows_ when
  /// there is more than one trainer (the local sum lands there, ready for the allreduce).
  std::vector<float, Eigen::aligned_allocator<float>> local_rows_;
  std::vector<float*> shard_rows_;
};

}  // namespace fashion_mnist
