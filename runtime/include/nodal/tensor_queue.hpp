// nodal::TensorQueue: a named, bounded, multi-producer multi-consumer queue of tensors between
// the processes of a job. A tensor in the shared arena travels as an offset (zero-copy); a
// private one is moved into the arena once. The idea is torch.multiprocessing.Queue's; unlike
// torch, a received tensor may be put on another queue.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nodal/tensor.hpp>

namespace nodal {

namespace detail {
struct QueueState;
}

/// One message: a tensor (may be undefined, for a pure message), any number of further tensors,
/// small metadata and a payload of bytes of any size (multiprocessing.Queue carries any object;
/// here the bytes are the caller's serialisation, the tensors travel by handle).
struct QueueItem {
  Tensor tensor;
  std::int64_t index = 0;  ///< e.g. a batch number
  std::int64_t label = 0;  ///< e.g. a class or a tag
  /// Bytes of any size (not only text): up to TensorQueue::kInlineText they ride in the queue's
  /// cell, beyond that in a block of the arena (one copy in, one copy out).
  std::string text;
  /// More tensors, each shared like `tensor` (by handle, never copied once in the arena).
  std::vector<Tensor> tensors{};
};

class TensorQueue {
 public:
  /// Text bytes carried in the queue's cell; a longer text goes through an arena block.
  static constexpr std::size_t kInlineText = 96;

  /// The job's queue called `name`, holding at most `capacity` items; created by the first
  /// opener in any process. Throws UsageError when it exists with another capacity or when
  /// capacity is 0, ShmError when the arena has no room.
  static TensorQueue open(const std::string& name, std::size_t capacity = 64);

  /// Appends an item, waiting while the queue is full. The tensor's storage is shared, not
  /// copied: a private tensor is first moved into the arena (Tensor::share_memory(), which the
  /// caller's tensor sees too), a file-backed one is copied into the arena. The consumer sees the
  /// same bytes: writes after put() are visible to it (no snapshot).
  /// Throws UsageError on a closed queue or a tensor with more than Tensor::kMaxDims dimensions;
  /// ShmError when the arena has no room for a long text or the further tensors' handles;
  /// TimeoutError; PeerFailure when the job has failed.
  void put(QueueItem item, std::optional<std::chrono::nanoseconds> timeout = std::nullopt);
  void put(const Tensor& tensor, std::optional<std::chrono::nanoseconds> timeout = std::nullopt) {
    put(QueueItem{tensor, 0, 0, {}}, timeout);
  }

  /// The oldest item, waiting while the queue is empty. nullopt once the queue is closed and
  /// drained (end of stream). Throws TimeoutError, PeerFailure.
  std::optional<QueueItem> get(std::optional<std::chrono::nanoseconds> timeout = std::nullopt);
  /// The oldest item, or nullopt at once when there is none (closed() tells whether more can come).
  std::optional<QueueItem> try_get();

  /// Waits until an item is queued or the queue is closed, without taking anything; false when
  /// `timeout` passed first. Throws PeerFailure.
  bool wait_readable(std::optional<std::chrono::nanoseconds> timeout = std::nullopt);

  /// Removes the job's queue called `name` (nothing when there is none): drops the items still in
  /// it (releasing their tensors) and gives its memory back to the arena. For a queue no process
  /// uses any more (its producers and consumers ended): a TensorQueue object of it left anywhere
  /// is dangling. Throws PeerFailure when a process died holding the arena's lock.
  static void unlink(const std::string& name);

  /// No more puts; consumers drain what is queued and then get nullopt. Idempotent.
  void close();
  bool closed() const;
  /// Items queued now (a snapshot).
  std::size_t size() const;
  std::size_t capacity() const;

 private:
  explicit TensorQueue(detail::QueueState* state) : state_(state) {}
  detail::QueueState* state_;
};

}  // namespace nodal
