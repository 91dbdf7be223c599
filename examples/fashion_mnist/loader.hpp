// Loaders: processes that turn the decoded data set into training batches (normalised f32
// images and i32 labels, in the shuffled order of the plan) in the job's shared arena, and hand
// them to their trainer through TensorQueues: the trainer reads the loader's bytes in place, with
// no pickling or copying between processes (the case torch's DataLoader workers pay for).
//
// Each trainer has `loaders` loader slots; slot j makes the batches of the global steps s with
// s % loaders == j and puts them on its own queue, which has one producer and one consumer, so
// the trainer gets every step's batch in order by reading queue s % loaders.
#pragma once

#include <nodal/tensor.hpp>
#include <nodal/tensor_queue.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "idx.hpp"
#include "plan.hpp"

namespace fashion_mnist {

/// What one loader does.
struct LoaderTask {
  const Split* train = nullptr;  ///< the decoded training set
  Plan plan;
  int trainer = 0;  ///< the trainer it feeds
  int slot = 0;     ///< 0 .. loaders-1
  int loaders = 1;
  int prefetch = 4;           ///< batches it may have queued
  std::int64_t fail_at = -1;  ///< failure drill: throw at this global step (-1: never)
  std::int64_t first_step = 0;  ///< resuming from a checkpoint: the steps before it are skipped
};

/// Pixels u8 -> f32 (pixel / 255 - mean) / std, with the training set's mean and std: what the
/// loaders do to every image and the trainer to the test set.
void normalise(const std::uint8_t* pixels, std::size_t count, float* out);

/// The queue of (trainer, slot).
std::string queue_name(int trainer, int slot);
/// Items a queue holds: two per batch (images, then labels).
std::size_t queue_capacity(int prefetch);

/// Makes and queues every batch of the task, then closes its queue. Blocks while the queue is
/// full. Throws nodal::PeerFailure when the job fails, nodal::UsageError when the trainer closed
/// the queue (it is going away).
void run_loader(const LoaderTask& task);

/// One step's part of the global batch for one trainer: images f32 [local_batch, 784] (row-major,
/// normalised) and labels i32 [local_batch], both in the arena.
struct Batch {
  nodal::Tensor images;
  nodal::Tensor labels;
};

/// A loader's queue ended (closed and drained) before the step the trainer wanted.
class LoaderEnded : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The trainer's end of its loaders' queues.
class BatchReceiver {
 public:
  /// The queues of `trainer`'s loaders, whose batches have `rows` rows.
  BatchReceiver(int trainer, int loaders, int prefetch, std::int64_t rows);
  /// Global step `step`'s batch. Throws LoaderEnded when its loader's queue ended first,
  /// std::runtime_error when the loader sent something else than that step's batch.
  Batch next(std::int64_t step);
  /// Checks that every loader has closed its queue with nothing left in it (a clean end).
  void expect_end();
  /// Closes every queue: loaders blocked in put() wake up and fail (the trainer is going away).
  void close();

 private:
  int trainer_;
  std::int64_t rows_;
  std::vector<nodal::TensorQueue> queues_;
};

}  // namespace fashion_mnist
