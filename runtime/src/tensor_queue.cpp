#include <nodal/arena.hpp>
#include <nodal/errors.hpp>
#include <nodal/tensor_queue.hpp>
#include <nodal/detail/gpu.hpp>
#include <nodal/detail/storage.hpp>
#include <nodal/detail/termination_shield.hpp>
#include <nodal/detail/wait.hpp>
#include <nodal/detail/wait_record.hpp>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

namespace nodal {
namespace detail {

/// One tensor as it travels: offsets, never pointers.
struct TensorHandle {
  std::uint64_t storage = 0;  ///< arena offset of the ArenaStorageHeader; 0: no (cpu) tensor
  /// A cuda tensor travels by handle (gpu.hpp): kind none here means a cpu or no tensor. The
  /// consumer rebuilds it on its own view of device `gpu.device` (the same index when the ranks
  /// see the same CUDA_VISIBLE_DEVICES, as nodalrun --gpus arranges).
  gpu::WireTensor gpu{};
  bool on_cuda = false;
  std::int64_t byte_offset = 0;
  std::int64_t shape[Tensor::kMaxDims] = {};
  std::int64_t strides[Tensor::kMaxDims] = {};
  DType dtype = DType::f32;
  std::uint8_t ndim = 0;
};

/// A queued item as it sits in shared memory.
struct ItemHandle {
  TensorHandle tensor;
  std::int64_t index = 0;
  std::int64_t label = 0;
  /// Arena offset of the item's extra block (0: none): a text longer than kInlineText and the
  /// handles of the further tensors, laid out as ExtraHeader, TensorHandle[count], text bytes.
  std::uint64_t extra = 0;
  std::uint8_t text_size = 0;  ///< inline text only
  char text[TensorQueue::kInlineText] = {};
};

struct ExtraHeader {
  std::uint64_t text_bytes = 0;
  std::uint64_t tensor_count = 0;
};

/// Dmitry Vyukov's bounded MPMC queue (1024cores.net, "Bounded MPMC queue"): each cell carries a
/// sequence number telling producers and consumers whose turn it is, so neither side takes a lock.
/// A producer stalled (or killed) between claiming a cell and publishing it holds back the
/// consumers at that cell, and so every item after it: the queue is whole again only if it goes
/// on (nodal::Pool gives each worker its own result queue for this reason).
struct Cell {
  std::atomic<std::uint64_t> sequence;
  ItemHandle item;
};

/// Vyukov's queue needs at least 2 cells (with one, a full cell's sequence reads as free to the
/// next producer), so a capacity-1 queue has 2 cells and bounds its occupancy by counting.
inline std::uint64_t cell_count(std::uint64_t capacity) { return std::max<std::uint64_t>(capacity, 2); }

struct QueueState {
  QueueState(std::uint64_t n, std::string_view queue_name)
      : capacity(n), cell_count(detail::cell_count(n)), name(queue_name) {
    for (std::uint64_t i = 0; i < cell_count; ++i) new (&cells()[i]) Cell{{i}, {}};
  }
  Cell* cells() { return reinterpret_cast<Cell*>(this + 1); }

  const std::uint64_t capacity;
  const std::uint64_t cell_count;
  const ObjectName name;
  alignas(64) std::atomic<std::uint64_t> enqueue_pos{0};
  alignas(64) std::atomic<std::uint64_t> dequeue_pos{0};
  alignas(64) WaitWord not_empty;
  WaitWord not_full;
  std::atomic<std::uint32_t> closed{0};
};

namespace {

// Both run shielded from SIGTERM (termination_shield.hpp): a process ended between claiming a
// cell and publishing it would block that cell, and with it the queue, for everyone.
bool try_enqueue(QueueState& q, const ItemHandle& item) {
  const TerminationShield shield;
  std::uint64_t pos = q.enqueue_pos.load(std::memory_order_relaxed);
  for (;;) {
    if (q.capacity < q.cell_count && pos - q.dequeue_pos.load(std::memory_order_acquire) >= q.capacity) return false;
    Cell& cell = q.cells()[pos % q.cell_count];
    std::uint64_t seq = cell.sequence.load(std::memory_order_acquire);
    auto diff = static_cast<std::int64_t>(seq - pos);
    if (diff == 0) {
      if (q.enqueue_pos.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
        cell.item = item;
        cell.sequence.store(pos + 1, std::memory_order_release);
        return true;
      }
    } else if (diff < 0) {
      return false;  // full
    } else {
      pos = q.enqueue_pos.load(std::memory_order_relaxed);
    }
  }
}

bool try_dequeue(QueueState& q, ItemHandle& item) {
  const TerminationShield shield;
  std::uint64_t pos = q.dequeue_pos.load(std::memory_order_relaxed);
  for (;;) {
    Cell& cell = q.cells()[pos % q.cell_count];
    std::uint64_t seq = cell.sequence.load(std::memory_order_acquire);
    auto diff = static_cast<std::int64_t>(seq - (pos + 1));
    if (diff == 0) {
      if (q.dequeue_pos.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
        item = cell.item;
        cell.sequence.store(pos + q.cell_count, std::memory_order_release);
        return true;
      }
    } else if (diff < 0) {
      return false;  // empty
    } else {
      pos = q.dequeue_pos.load(std::memory_order_relaxed);
    }
  }
}

/// The handle of `t`, holding one new reference to its storage. A private tensor is moved into
/// the arena first (the caller's tensor then sees the move too).
TensorHandle make_tensor_handle(Tensor& t) {
  TensorHandle handle;
  if (!t.defined()) return handle;
  if (t.dim() > Tensor::kMaxDims) {
    throw UsageError(fmt::format("TensorQueue::put: {} dimensions, at most {}", t.dim(), Tensor::kMaxDims));
  }
  if (t.device().kind == Device::Kind::cuda) {
    // The memory stays where it is; the handle holds an in-flight reference to it and an event
    // after the producer's work on its current stream.
    handle.on_cuda = true;
    handle.gpu = gpu::export_storage(*t.storage(), cuda::current_stream());
  } else {
    Arena& arena = job_arena();
    if (!t.in_arena() || t.storage()->arena() != &arena) {
      if (t.storage()->kind() == Storage::Kind::heap || t.storage()->kind() == Storage::Kind::external) {
        t.share_memory();
      } else {
        // A file, or an arena the receiver does not map (made before init()): one copy into ours.
        t = t.clone().share_memory();
      }
    }
    handle.storage = t.storage()->arena_offset();
  }
  handle.byte_offset = t.storage_offset();
  handle.dtype = t.dtype();
  handle.ndim = static_cast<std::uint8_t>(t.dim());
  std::copy(t.shape().begin(), t.shape().end(), handle.shape);
  std::copy(t.strides().begin(), t.strides().end(), handle.strides);
  if (!handle.on_cuda) t.storage()->retain_for_handle();
  return handle;
}

void release_tensor_handle(const TensorHandle& handle) {
  if (handle.on_cuda) gpu::release_wire(handle.gpu);
  if (handle.storage != 0) Storage::adopt_arena(job_arena(), handle.storage);
}

Tensor from_tensor_handle(const TensorHandle& handle) {
  if (handle.on_cuda) {
    auto storage = gpu::import_storage(handle.gpu, cuda::current_stream());
    return Tensor(std::move(storage), handle.byte_offset, {handle.shape, handle.shape + handle.ndim},
                  {handle.strides, handle.strides + handle.ndim}, handle.dtype, Device::cuda(handle.gpu.device));
  }
  if (handle.storage == 0) return Tensor();
  return Tensor(Storage::adopt_arena(job_arena(), handle.storage), handle.byte_offset,
                {handle.shape, handle.shape + handle.ndim}, {handle.strides, handle.strides + handle.ndim}, handle.dtype);
}

ExtraHeader& extra_header(std::uint64_t offset) { return *static_cast<ExtraHeader*>(job_arena().at(offset)); }
TensorHandle* extra_tensors(std::uint64_t offset) {
  return reinterpret_cast<TensorHandle*>(static_cast<std::byte*>(job_arena().at(offset)) + sizeof(ExtraHeader));
}
char* extra_text(std::uint64_t offset) {
  return reinterpret_cast<char*>(extra_tensors(offset) + extra_header(offset).tensor_count);
}

/// Drops what a handle holds (a put that did not happen).
void release_handle(const ItemHandle& handle) {
  release_tensor_handle(handle.tensor);
  if (handle.extra == 0) return;
  const std::uint64_t count = extra_header(handle.extra).tensor_count;
  for (std::uint64_t i = 0; i < count; ++i) release_tensor_handle(extra_tensors(handle.extra)[i]);
  job_arena().deallocate(job_arena().at(handle.extra));
}

/// The handle of an item: references to its tensors, its text inline or with the further
/// tensors' handles in one arena block.
ItemHandle make_handle(QueueItem& item) {
  ItemHandle handle;
  handle.index = item.index;
  handle.label = item.label;
  const bool long_text = item.text.size() > TensorQueue::kInlineText;
  if (long_text || !item.tensors.empty()) {
    const std::size_t count = item.tensors.size();
    const std::size_t text_bytes = long_text ? item.text.size() : 0;
    Arena& arena = job_arena();
    void* block = arena.allocate(sizeof(ExtraHeader) + count * sizeof(TensorHandle) + text_bytes);
    handle.extra = arena.offset_of(block);
    new (block) ExtraHeader{text_bytes, 0};
    TensorHandle* handles = extra_tensors(handle.extra);
    try {
      for (std::size_t i = 0; i < count; ++i) {
        new (&handles[i]) TensorHandle(make_tensor_handle(item.tensors[i]));
        extra_header(handle.extra).tensor_count = i + 1;  // what release_handle must undo
      }
      std::memcpy(extra_text(handle.extra), item.text.data(), text_bytes);
    } catch (...) {
      release_handle(handle);
      throw;
    }
  }
  if (!long_text) {
    handle.text_size = static_cast<std::uint8_t>(item.text.size());
    std::memcpy(handle.text, item.text.data(), item.text.size());
  }
  try {
    handle.tensor = make_tensor_handle(item.tensor);
  } catch (...) {
    release_handle(handle);
    throw;
  }
  return handle;
}

QueueItem from_handle(const ItemHandle& handle) {
  QueueItem item;
  item.index = handle.index;
  item.label = handle.label;
  item.text.assign(handle.text, handle.text_size);
  item.tensor = from_tensor_handle(handle.tensor);
  if (handle.extra != 0) {
    const ExtraHeader& header = extra_header(handle.extra);
    const TensorHandle* handles = extra_tensors(handle.extra);
    item.tensors.reserve(header.tensor_count);
    for (std::uint64_t i = 0; i < header.tensor_count; ++i) item.tensors.push_back(from_tensor_handle(handles[i]));
    if (header.text_bytes != 0) item.text.assign(extra_text(handle.extra), header.text_bytes);
    job_arena().deallocate(job_arena().at(handle.extra));
  }
  return item;
}

}  // namespace
}  // namespace detail

TensorQueue TensorQueue::open(const std::string& name, std::size_t capacity) {
  if (capacity == 0) throw UsageError(fmt::format("TensorQueue::open({}): capacity must be at least 1", name));
  std::size_t bytes = sizeof(detail::QueueState) + detail::cell_count(capacity) * sizeof(detail::Cell);
  std::string object = "queue:" + name;
  // The size check in find_or_create catches another capacity; say it in queue terms.
  void* state = nullptr;
  try {
    state = detail::job_arena().find_or_create(object.c_str(), bytes, alignof(detail::QueueState),
                                               [&](void* where) { new (where) detail::QueueState(capacity, name); });
  } catch (const UsageError&) {
    throw UsageError(fmt::format("TensorQueue '{}' exists with another capacity than {}", name, capacity));
  }
  return TensorQueue(static_cast<detail::QueueState*>(state));
}

void TensorQueue::unlink(const std::string& name) {
  const std::string object = "queue:" + name;
  Arena& arena = detail::job_arena();
  void* state = arena.find(object.c_str());
  if (state == nullptr) return;
  TensorQueue queue(static_cast<detail::QueueState*>(state));
  while (queue.try_get()) {
  }
  arena.destroy(object.c_str());
}

namespace {

/// A put or get as the wait table shows it (wait_record.hpp).
struct QueueCall {
  const TensorQueue& queue;
  const detail::QueueState& state;
  bool is_put;

  static void describe(const void* self, std::string& what, std::string& waiting_for) {
    const QueueCall& call = *static_cast<const QueueCall*>(self);
    what = fmt::format("TensorQueue '{}' {}", call.state.name.text, call.is_put ? "put" : "get");
    waiting_for = call.is_put ? fmt::format("a get (the queue is full: {} items)", call.queue.size())
                              : std::string("a put (the queue is empty)");
  }
};

}  // namespace

void TensorQueue::put(QueueItem item, std::optional<std::chrono::nanoseconds> timeout) {
  const QueueCall described{*this, *state_, true};
  detail::BlockingCall blocking(&QueueCall::describe, &described);
  if (closed()) throw UsageError("TensorQueue::put on a closed queue");
  detail::ItemHandle handle = detail::make_handle(item);
  try {
    detail::wait_until(
        state_->not_full,
        [&] {
          if (closed()) throw UsageError("TensorQueue::put on a closed queue");
          return detail::try_enqueue(*state_, handle);
        },
        detail::Deadline::after(timeout), "TensorQueue::put");
  } catch (...) {
    detail::release_handle(handle);
    throw;
  }
  detail::notify(state_->not_empty);
}

std::optional<QueueItem> TensorQueue::get(std::optional<std::chrono::nanoseconds> timeout) {
  const QueueCall described{*this, *state_, false};
  detail::BlockingCall blocking(&QueueCall::describe, &described);
  detail::ItemHandle handle;
  bool got = false;
  detail::wait_until(
      state_->not_empty,
      [&] {
        got = detail::try_dequeue(*state_, handle);
        return got || closed();
      },
      detail::Deadline::after(timeout), "TensorQueue::get");
  // Closed: one more look, in case an item landed between the dequeue attempt and the flag.
  if (!got && !(got = detail::try_dequeue(*state_, handle))) return std::nullopt;
  detail::notify(state_->not_full);
  return detail::from_handle(handle);
}

std::optional<QueueItem> TensorQueue::try_get() {
  detail::ItemHandle handle;
  if (!detail::try_dequeue(*state_, handle)) return std::nullopt;
  detail::notify(state_->not_full);
  return detail::from_handle(handle);
}

bool TensorQueue::wait_readable(std::optional<std::chrono::nanoseconds> timeout) {
  const QueueCall described{*this, *state_, false};
  detail::BlockingCall blocking(&QueueCall::describe, &described);
  try {
    detail::wait_until(
        state_->not_empty, [&] { return size() > 0 || closed(); }, detail::Deadline::after(timeout),
        "TensorQueue::wait_readable");
  } catch (const TimeoutError&) {
    return false;
  }
  return true;
}

void TensorQueue::close() {
  state_->closed.store(1, std::memory_order_release);
  detail::notify(state_->not_empty);
  detail::notify(state_->not_full);
}

bool TensorQueue::closed() const { return state_->closed.load(std::memory_order_acquire) != 0; }

std::size_t TensorQueue::size() const {
  std::uint64_t enqueued = state_->enqueue_pos.load(std::memory_order_acquire);
  std::uint64_t dequeued = state_->dequeue_pos.load(std::memory_order_acquire);
  return enqueued > dequeued ? static_cast<std::size_t>(enqueued - dequeued) : 0;
}

std::size_t TensorQueue::capacity() const { return state_->capacity; }

}  // namespace nodal
