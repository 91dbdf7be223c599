// Point-to-point send/recv on the shared-memory path: per ordered pair of ranks a channel in the
// arena, a ring of kP2PDepth chunks the sender fills and the receiver empties (rendezvous: send
// returns once recv has copied it all). A count, dtype or tag mismatch breaks the pair's channel.
#include "shm/algorithms.hpp"

#include "internode/across_nodes.hpp"

#include <nodal/errors.hpp>
#include <nodal/detail/units.hpp>
#include <nodal/detail/wait_record.hpp>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>

#include <fmt/format.h>

namespace nodal::detail {
namespace {

/// One direction between two ranks: a ring of kP2PDepth entries the sender fills and the
/// receiver empties, and the description of the message in flight.
struct P2PChannel {
  alignas(kCacheLine) std::atomic<std::uint64_t> sent{0};   ///< step_flag(message, step) staged
  alignas(kCacheLine) std::atomic<std::uint64_t> acked{0};  ///< step_flag(message, step) copied out
  alignas(kCacheLine) std::uint64_t count = 0;
  DType dtype = DType::u8;
  std::int32_t tag = 0;
  std::atomic<std::uint32_t> broken{0};  ///< a mismatch was seen: the channel is unusable
};
constexpr std::size_t kP2PChunk = 256 * 1024;
constexpr std::size_t kP2PDepth = 2;
constexpr std::size_t kP2PHeader = 4096;

/// The channel from -> to, made by the first call that needs it (with the per-peer counters).
P2PChannel& channel(CommState& comm, int from, int to) {
  const std::size_t index = static_cast<std::size_t>(from) * comm.size + to;
  std::lock_guard lock(comm.p2p_mutex);
  if (comm.p2p_channels.empty()) {
    comm.p2p_channels.assign(static_cast<std::size_t>(comm.size) * comm.size, nullptr);
    comm.p2p_sent.assign(static_cast<std::size_t>(comm.size), 0);
    comm.p2p_received.assign(static_cast<std::size_t>(comm.size), 0);
  }
  void*& slot = comm.p2p_channels[index];
  if (slot == nullptr) {
    std::string name = fmt::format("nodal.p2p:{}:{}-{}", comm.name, from, to);
    slot = comm.arena->find_or_create(name.c_str(), kP2PHeader + kP2PDepth * kP2PChunk, 4096,
                                      [](void* where) { new (where) P2PChannel(); });
  }
  return *static_cast<P2PChannel*>(slot);
}

std::byte* channel_entry(P2PChannel& ch, std::uint64_t step) {
  return reinterpret_cast<std::byte*>(&ch) + kP2PHeader + (step % kP2PDepth) * kP2PChunk;
}

void check_channel(const P2PChannel& ch, const CommState& comm, int from, int to) {
  if (ch.broken.load(std::memory_order_acquire) != 0) {
    throw UsageError(fmt::format("send/recv between ranks {} and {} of communicator '{}': count, dtype or tag of the "
                                 "send and the recv differ (sent {} x {}, tag {}); the pair's channel is unusable now",
                                 from, to, comm.name, ch.count, dtype_name(ch.dtype), ch.tag));
  }
}

/// A send or recv as the wait table shows it (wait_record.hpp).
struct P2PCall {
  const CommState& comm;
  bool is_send;
  int peer;
  std::size_t bytes;

  static void describe(const void* self, std::string& what, std::string& waiting_for) {
    const P2PCall& call = *static_cast<const P2PCall*>(self);
    const int peer = call.comm.global_ranks[call.peer];
    what = fmt::format("{} of {} {} rank {} on communicator '{}'", call.is_send ? "send" : "recv",
                       format_bytes(call.bytes), call.is_send ? "to" : "from", peer, call.comm.name);
    waiting_for = fmt::format("rank {} to {} it", peer, call.is_send ? "recv" : "send");
  }
};

void check_peer(const CommState& comm, int peer, const char* what) {
  if (peer < 0 || peer >= comm.size || peer == comm.rank) {
    throw UsageError(fmt::format("{}: peer {} is not another rank of communicator '{}' (size {}, this rank {})", what,
                                 peer, comm.name, comm.size, comm.rank));
  }
  if (comm.across_nodes && !on_this_node(comm, {comm.rank, peer})) {
    throw UsageError(fmt::format("{} on communicator '{}': rank {} is on another node, and send and recv between nodes "
                                 "are not built yet (between ranks of one node they are)",
                                 what, comm.name, peer));
  }
}

}  // namespace

void send_message(CommState& comm, const void* input, std::size_t count, DType dtype, int peer, int tag) {
  check_peer(comm, peer, "send");
  const P2PCall described{comm, true, peer, count * element_size(dtype)};
  BlockingCall blocking(&P2PCall::describe, &described);
  check_job_alive();
  P2PChannel& ch = channel(comm, comm.rank, peer);
  check_channel(ch, comm, comm.rank, peer);
  const std::uint64_t message = ++comm.p2p_sent[peer];
  const std::size_t total = count * element_size(dtype);
  const std::size_t steps = std::max<std::size_t>(1, ceil_div(total, kP2PChunk));
  // The previous message is fully acknowledged (send is a rendezvous), so the header is free.
  ch.count = count;
  ch.dtype = dtype;
  ch.tag = tag;
  for (std::size_t i = 0; i < steps; ++i) {
    if (i >= kP2PDepth) {
      wait_until(
          comm.shared->word,
          [&] { return ch.acked.load(std::memory_order_acquire) >= step_flag(message, i - kP2PDepth) || ch.broken.load(); },
          Deadline{}, "send");
      check_channel(ch, comm, comm.rank, peer);
    }
    const std::size_t begin = i * kP2PChunk;
    const std::size_t len = std::min(kP2PChunk, total - std::min(total, begin));
    if (len != 0) std::memcpy(channel_entry(ch, i), bytes(input) + begin, len);
    publish(comm, ch.sent, step_flag(message, i));
  }
  wait_until(
      comm.shared->word,
      [&] { return ch.acked.load(std::memory_order_acquire) >= step_flag(message, steps - 1) || ch.broken.load(); },
      Deadline{}, "send");
  check_channel(ch, comm, comm.rank, peer);
}

void recv_message(CommState& comm, void* output, std::size_t count, DType dtype, int peer, int tag) {
  check_peer(comm, peer, "recv");
  const P2PCall described{comm, false, peer, count * element_size(dtype)};
  BlockingCall blocking(&P2PCall::describe, &described);
  check_job_alive();
  P2PChannel& ch = channel(comm, peer, comm.rank);
  check_channel(ch, comm, peer, comm.rank);
  const std::uint64_t message = ++comm.p2p_received[peer];
  wait_flag(comm, ch.sent, step_flag(message, 0), "recv");
  if (ch.count != count || ch.dtype != dtype || ch.tag != tag) {
    std::uint64_t sent = ch.count;
    DType sent_dtype = ch.dtype;
    std::int32_t sent_tag = ch.tag;
    ch.broken.store(1, std::memory_order_release);
    notify(comm.shared->word);
    // A tag differing from the next message's is not a wait for a later message, as an MPI
    // recv would: the sender of this one is blocked until it is received (a rendezvous), so a
    // later one could never come.
    throw UsageError(fmt::format("recv of {} x {} (tag {}) from rank {} on communicator '{}' got a send of {} x {} "
                                 "(tag {}); messages between two ranks are matched in order; the pair's channel is "
                                 "unusable now",
                                 count, dtype_name(dtype), tag, peer, comm.name, sent, dtype_name(sent_dtype),
                                 sent_tag));
  }
  const std::size_t total = count * element_size(dtype);
  const std::size_t steps = std::max<std::size_t>(1, ceil_div(total, kP2PChunk));
  for (std::size_t i = 0; i < steps; ++i) {
    if (i > 0) wait_flag(comm, ch.sent, step_flag(message, i), "recv");
    const std::size_t begin = i * kP2PChunk;
    const std::size_t len = std::min(kP2PChunk, total - std::min(total, begin));
    if (len != 0) std::memcpy(bytes(output) + begin, channel_entry(ch, i), len);
    publish(comm, ch.acked, step_flag(message, i));
  }
}

}  // namespace nodal::detail
