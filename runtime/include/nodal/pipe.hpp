// nodal::Pipe: two connected ends that send messages to each other, like Python's
// multiprocessing.Pipe / multiprocessing.connection.Connection: bytes of any size, trivially
// copyable values and tensors (by handle: a shared tensor is never copied, a private one is moved
// into the arena once). Between a parent and the children it forks or spawns (make the Pipe
// before them), and between the ranks of a job by name. Each direction is a TensorQueue, so a
// message waits in the arena, not in a kernel buffer.
#pragma once

#include <nodal/sync.hpp>
#include <nodal/tensor.hpp>
#include <nodal/tensor_queue.hpp>

#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace nodal {

namespace detail {
struct PipeState;
}

/// One end of a pipe. Copies of a Connection are the same end. An end belongs to the first
/// process that sends or receives on it: that is the process whose death the other end notices.
class Connection {
 public:
  /// Sends `bytes` (any size). Throws UsageError when this end is closed or cannot send (the
  /// receiving end of a one-way pipe); PeerFailure when the job failed.
  void send_bytes(std::string_view bytes);
  /// The next message's bytes. Throws EndOfStream when the other end closed and everything it
  /// sent has been received; PeerFailure when the process owning the other end died; TimeoutError;
  /// UsageError when the next message is a tensor or this end cannot receive.
  std::string recv_bytes(Timeout timeout = std::nullopt);

  /// A trivially copyable value (its bytes). recv<T> throws UsageError when the message's size is
  /// not sizeof(T).
  template <class T>
  void send(const T& value) {
    static_assert(std::is_trivially_copyable_v<T>, "send<T>: T must be trivially copyable (or send bytes)");
    send_bytes(std::string_view(reinterpret_cast<const char*>(&value), sizeof(T)));
  }
  template <class T>
  T recv(Timeout timeout = std::nullopt) {
    static_assert(std::is_trivially_copyable_v<T>, "recv<T>: T must be trivially copyable (or receive bytes)");
    const std::string bytes = recv_bytes(timeout);
    check_size(bytes.size(), sizeof(T));
    T value;
    std::memcpy(&value, bytes.data(), sizeof(T));
    return value;
  }

  /// A tensor, by handle (see TensorQueue::put). recv_tensor throws UsageError when the next
  /// message is bytes; otherwise as recv_bytes.
  void send_tensor(const Tensor& tensor);
  Tensor recv_tensor(Timeout timeout = std::nullopt);

  /// Whether a message (or the end of the stream) is there to receive, waiting up to `timeout`
  /// (0: just look; nullopt: wait until there is). Throws PeerFailure as recv does.
  bool poll(Timeout timeout = std::chrono::nanoseconds(0));

  /// This end sends and receives no more: the other end receives what was sent, then EndOfStream.
  /// Idempotent.
  void close();
  bool closed() const;
  bool readable() const { return in_.has_value(); }
  bool writable() const { return out_.has_value(); }

 private:
  friend std::pair<Connection, Connection> Pipe(bool duplex);
  friend std::pair<Connection, Connection> open_pipe(const std::string& name, bool duplex);
  Connection(detail::PipeState* state, int side, std::optional<TensorQueue> in, std::optional<TensorQueue> out);
  QueueItem receive(Timeout timeout);
  void send_item(QueueItem item);
  void claim();
  void check_size(std::size_t got, std::size_t want) const;

  detail::PipeState* state_;
  int side_;  ///< 0: the first end, 1: the second
  std::optional<TensorQueue> in_;   ///< what the other end sends (none: a one-way pipe's sender)
  std::optional<TensorQueue> out_;  ///< what this end sends (none: a one-way pipe's receiver)
};

/// A new pipe (multiprocessing.Pipe(duplex)): duplex, each end sends and receives; otherwise the
/// first end only receives and the second only sends, as in Python. Throws ShmError.
std::pair<Connection, Connection> Pipe(bool duplex = true);

/// The job's pipe called `name`, for ranks that agree on the name (rank 0 takes .first, rank 1
/// .second, say); made by the first opener. Throws UsageError when it exists with the other
/// `duplex`; ShmError.
std::pair<Connection, Connection> open_pipe(const std::string& name, bool duplex = true);

}  // namespace nodal
