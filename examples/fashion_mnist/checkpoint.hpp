// Checkpoints: what training needs to go on bit for bit after a restart (nodalrun --max-restarts)
// — the weights, SGD's momentum buffer and the next global step — written by trainer 0 every
// --checkpoint-every steps and read back by every process of the job when it starts. The format
// is Boost.Serialization's binary archive; a checkpoint is written to a temporary file in the
// same directory and renamed over the old one, so a crash mid-write leaves the last good one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "options.hpp"
#include "plan.hpp"

namespace fashion_mnist {

struct Checkpoint {
  std::int64_t next_step = 0;  ///< the first global step not yet trained
  /// What fixes the run's arithmetic: a checkpoint of another run is refused, not resumed.
  std::uint64_t seed = 0;
  std::int64_t train_size = 0;
  int global_batch = 0;
  int shards = 0;
  int epochs = 0;
  float learning_rate = 0;
  float momentum = 0;
  std::vector<float> parameters;  ///< Mlp's padded layout
  std::vector<float> velocity;    ///< the momentum buffer, same layout

  template <class Archive>
  void serialize(Archive& archive, unsigned /*version*/) {
    archive & next_step & seed & train_size & global_batch & shards & epochs & learning_rate & momentum &
        parameters & velocity;
  }
};

/// A checkpoint of this run's plan and options, with its state still to be filled.
Checkpoint checkpoint_of(const Plan& plan, const Options& options);

/// Writes `checkpoint` to `path` atomically (a temporary file, fsync, rename). Throws
/// std::runtime_error saying which file could not be written.
void save_checkpoint(const Checkpoint& checkpoint, const std::string& path);

/// The checkpoint at `path`, or nullopt when there is none. Throws std::runtime_error when the
/// file cannot be read or belongs to another run (other seed, batch, epochs, ...): resuming it
/// would silently train something else.
std::optional<Checkpoint> load_checkpoint(const std::string& path, const Plan& plan, const Options& options);

}  // namespace fashion_mnist
