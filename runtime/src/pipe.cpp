#include <nodal/arena.hpp>
#include <nodal/errors.hpp>
#include <nodal/pipe.hpp>
#include <nodal/detail/posix.hpp>
#include <nodal/detail/storage.hpp>
#include <nodal/detail/wait.hpp>
#include <nodal/detail/wait_record.hpp>

#include <unistd.h>

#include <atomic>

#include <fmt/format.h>

namespace nodal {
namespace detail {

/// What both ends share: who owns each end (the first process that used it), whether it closed.
struct PipeState {
  PipeState(bool is_duplex, std::string_view pipe_name) : duplex(is_duplex), name(pipe_name) {}
  const bool duplex;
  std::atomic<std::int32_t> owner[2] = {0, 0};
  std::atomic<std::uint32_t> closed[2] = {0, 0};  ///< the end closed itself
  const ObjectName name;
};

namespace {

/// Messages a pipe carries, in QueueItem::label.
constexpr std::int64_t kBytes = 1;
constexpr std::int64_t kTensor = 2;

/// How often a receiver waiting for a message looks whether the other end's process still lives.
constexpr auto kLivenessSlice = std::chrono::milliseconds(100);
/// Messages in flight in one direction before send waits (Python's pipe holds a socket buffer).
constexpr std::size_t kPipeCapacity = 64;

std::string queue_name(const std::string& pipe, int from, int to) { return fmt::format("pipe:{}:{}to{}", pipe, from, to); }

std::string anonymous_name() {
  static std::atomic<std::uint64_t> count{0};
  return fmt::format("anonymous-{}-{}", ::getpid(), count.fetch_add(1));
}

}  // namespace
}  // namespace detail

std::pair<Connection, Connection> open_pipe(const std::string& name, bool duplex) {
  Arena& arena = detail::job_arena();
  auto& state = arena.find_or_construct<detail::PipeState>(("pipe:" + name).c_str(), duplex, name);
  if (state.duplex != duplex) {
    throw UsageError(fmt::format("pipe '{}' exists {}, not {}", name, state.duplex ? "duplex" : "one-way",
                                 duplex ? "duplex" : "one-way"));
  }
  // 1 -> 0 always (a one-way pipe's second end sends to its first, as in Python); 0 -> 1 if duplex.
  TensorQueue to_first = TensorQueue::open(detail::queue_name(name, 1, 0), detail::kPipeCapacity);
  std::optional<TensorQueue> to_second;
  if (duplex) to_second = TensorQueue::open(detail::queue_name(name, 0, 1), detail::kPipeCapacity);
  return {Connection(&state, 0, to_first, to_second), Connection(&state, 1, to_second, to_first)};
}

std::pair<Connection, Connection> Pipe(bool duplex) { return open_pipe(detail::anonymous_name(), duplex); }

Connection::Connection(detail::PipeState* state, int side, std::optional<TensorQueue> in, std::optional<TensorQueue> out)
    : state_(state), side_(side), in_(in), out_(out) {}

void Connection::claim() {
  std::int32_t none = 0;
  state_->owner[side_].compare_exchange_strong(none, static_cast<std::int32_t>(::getpid()), std::memory_order_acq_rel);
}

void Connection::check_size(std::size_t got, std::size_t want) const {
  if (got != want) {
    throw UsageError(fmt::format("pipe '{}': received a message of {} bytes for a value of {} bytes (recv<T> must match "
                                 "the sender's send<T>)",
                                 state_->name.text, got, want));
  }
}

void Connection::send_item(QueueItem item) {
  if (!out_) throw UsageError(fmt::format("pipe '{}': this end only receives (a one-way pipe)", state_->name.text));
  if (closed()) throw UsageError(fmt::format("pipe '{}': send on a closed end", state_->name.text));
  claim();
  if (out_->closed()) throw EndOfStream(fmt::format("pipe '{}': the other end is closed", state_->name.text));
  try {
    out_->put(std::move(item));
  } catch (const UsageError&) {
    if (out_->closed()) throw EndOfStream(fmt::format("pipe '{}': the other end is closed", state_->name.text));
    throw;
  }
}

QueueItem Connection::receive(Timeout timeout) {
  if (!in_) throw UsageError(fmt::format("pipe '{}': this end only sends (a one-way pipe)", state_->name.text));
  if (closed()) throw UsageError(fmt::format("pipe '{}': recv on a closed end", state_->name.text));
  claim();
  const auto deadline = detail::Deadline::after(timeout);
  for (;;) {
    auto slice = std::chrono::duration_cast<std::chrono::nanoseconds>(detail::kLivenessSlice);
    if (deadline.at) slice = std::min(slice, std::chrono::duration_cast<std::chrono::nanoseconds>(*deadline.at - detail::Clock::now()));
    try {
      std::optional<QueueItem> item = in_->get(std::max(slice, std::chrono::nanoseconds(0)));
      if (!item) {
        throw EndOfStream(fmt::format("pipe '{}': the other end closed, and everything it sent was received",
                                      state_->name.text));
      }
      return std::move(*item);
    } catch (const TimeoutError&) {
      const int peer = state_->owner[1 - side_].load(std::memory_order_acquire);
      if (peer > 0 && !detail::process_alive(peer)) {
        throw PeerFailure(fmt::format("pipe '{}': the process at the other end (pid {}) died", state_->name.text, peer));
      }
      if (deadline.at && detail::Clock::now() >= *deadline.at) {
        throw TimeoutError(fmt::format("pipe '{}': recv timed out", state_->name.text));
      }
    }
  }
}

void Connection::send_bytes(std::string_view bytes) { send_item({Tensor(), 0, detail::kBytes, std::string(bytes), {}}); }

std::string Connection::recv_bytes(Timeout timeout) {
  QueueItem item = receive(timeout);
  if (item.label != detail::kBytes) {
    throw UsageError(fmt::format("pipe '{}': recv_bytes, but the next message is a tensor (use recv_tensor)", state_->name.text));
  }
  return std::move(item.text);
}

void Connection::send_tensor(const Tensor& tensor) { send_item({tensor, 0, detail::kTensor, {}, {}}); }

Tensor Connection::recv_tensor(Timeout timeout) {
  QueueItem item = receive(timeout);
  if (item.label != detail::kTensor) {
    throw UsageError(fmt::format("pipe '{}': recv_tensor, but the next message is bytes (use recv_bytes or recv<T>)",
                                 state_->name.text));
  }
  return std::move(item.tensor);
}

bool Connection::poll(Timeout timeout) {
  if (!in_) throw UsageError(fmt::format("pipe '{}': this end only sends (a one-way pipe)", state_->name.text));
  const auto deadline = detail::Deadline::after(timeout);
  for (;;) {
    auto slice = std::chrono::duration_cast<std::chrono::nanoseconds>(detail::kLivenessSlice);
    if (deadline.at) slice = std::min(slice, std::chrono::duration_cast<std::chrono::nanoseconds>(*deadline.at - detail::Clock::now()));
    if (in_->wait_readable(std::max(slice, std::chrono::nanoseconds(0)))) return true;
    const int peer = state_->owner[1 - side_].load(std::memory_order_acquire);
    if (peer > 0 && !detail::process_alive(peer)) {
      throw PeerFailure(fmt::format("pipe '{}': the process at the other end (pid {}) died", state_->name.text, peer));
    }
    if (deadline.at && detail::Clock::now() >= *deadline.at) return false;
  }
}

void Connection::close() {
  state_->closed[side_].store(1, std::memory_order_release);
  // The other end reads what is queued, then EndOfStream; its sends to us fail with EndOfStream.
  if (out_) out_->close();
  if (in_) in_->close();
}

bool Connection::closed() const { return state_->closed[side_].load(std::memory_order_acquire) != 0; }

}  // namespace nodal
