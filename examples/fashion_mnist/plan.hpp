// The training schedule: which samples make up each step and which trainer computes which part.
// Every trainer derives it from the options alone, so they agree without talking; and nothing in
// it but the ownership of shards depends on the number of trainers.
#pragma once

#include <nodal/data/sampler.hpp>

#include <cstdint>
#include <span>
#include <vector>

#include "options.hpp"

namespace fashion_mnist {

struct Plan {
  std::int64_t train_size = 0;       ///< samples trained on: the data set or --train-subset
  int global_batch = 0;              ///< samples per step, all trainers together
  int shards = 0;                    ///< the global batch in equal shards (a power of two)
  int shard_size = 0;                ///< global_batch / shards
  std::int64_t steps_per_epoch = 0;  ///< train_size / global_batch; the last partial batch is dropped
  int epochs = 0;
  std::uint64_t seed = 0;
  int trainers = 0;

  int shards_per_trainer() const { return shards / trainers; }
  /// Rows of one trainer's part of a step.
  int local_batch() const { return shards_per_trainer() * shard_size; }
  /// Trainer t owns shards [first_shard(t), first_shard(t) + shards_per_trainer()).
  int first_shard(int trainer) const { return trainer * shards_per_trainer(); }
  std::int64_t total_steps() const { return steps_per_epoch * epochs; }
};

/// The plan for `trainers` trainers. Throws std::invalid_argument (with a message for the user)
/// when the shard count is not a power of two, the trainer count not a power of two dividing it,
/// or the global batch exceeds the data.
Plan make_plan(const Options& options, std::int64_t data_size, int trainers);

/// The order of the training samples in `epoch`: a Fisher-Yates shuffle of 0..train_size-1
/// seeded by (seed, epoch).
std::vector<std::int32_t> epoch_order(const Plan& plan, int epoch);

/// The samples of trainer `trainer`'s part of step `step` (0 .. steps_per_epoch-1) of the epoch
/// whose order is `order`: local_batch() indices, shard after shard.
std::span<const std::int32_t> trainer_samples(const Plan& plan, const std::vector<std::int32_t>& order,
                                              std::int64_t step, int trainer);

/// One trainer's samples as a nodal::data sampler: epoch e's indices are trainer_samples() of
/// each step of e in turn, so that the DataLoader's batch n (batch_size local_batch()) is that
/// trainer's part of step n. Resuming at global step `first_step` (a checkpoint's), the epoch it
/// falls in starts there (fewer indices that epoch; size() is a whole epoch's).
class TrainerSampler : public nodal::data::Sampler {
 public:
  TrainerSampler(const Plan& plan, int trainer, std::int64_t first_step = 0);
  std::vector<std::int64_t> indices(std::int64_t epoch) const override;
  std::int64_t size() const override;

 private:
  Plan plan_;
  int trainer_;
  std::int64_t first_step_;
};

}  // namespace fashion_mnist
