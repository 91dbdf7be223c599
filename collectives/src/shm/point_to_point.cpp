// Point-to-point send/recv: per ordered pair of ranks a channel in the arena
// (nodal/detail/p2p_channel.hpp), a ring of kP2PDepth chunks the sender fills and the receiver
// empties (rendezvous: send returns once recv has copied it all). A count, dtype or tag mismatch
// breaks the pair's direction. Between ranks of different nodes each rank uses its channel as on
// one node, and the nodes' agents move the messages between the two nodes' arenas.
#include "shm/algorithms.hpp"

#include "internode/across_nodes.hpp"

#include <nodal/errors.hpp>
#include <nodal/detail/node_bridge.hpp>
#include <nodal/detail/p2p_channel.hpp>
#include <nodal/detail/units.hpp>
#include <nodal/detail/wait_record.hpp>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>

#include <fmt/format.h>

namespace nodal::detail {
namespace {

/// A direction's channel and the word its flags wake.
struct Endpoint {
  P2PChannel& ch;
  WaitWord& word;
  /// The node bridge when the pair spans nodes (this node's agent moves the messages), else null.
  NodeBridge* bridge;
};

/// The channel from -> to, made by the first call that needs it (with the per-peer counters).
/// A channel towards another node's rank is listed in the bridge's table for the agent.
Endpoint endpoint(CommState& comm, int from, int to) {
  const std::size_t index = static_cast<std::size_t>(from) * comm.size + to;
  const int from_global = comm.global_ranks[static_cast<std::size_t>(from)];
  const int to_global = comm.global_ranks[static_cast<std::size_t>(to)];
  NodeBridge* bridge =
      comm.across_nodes && !on_this_node(comm, {from_global, to_global}) ? comm.across_nodes->bridge : nullptr;
  std::lock_guard lock(comm.p2p_mutex);
  if (comm.p2p_channels.empty()) {
    comm.p2p_channels.assign(static_cast<std::size_t>(comm.size) * comm.size, nullptr);
    comm.p2p_sent.assign(static_cast<std::size_t>(comm.size), 0);
    comm.p2p_received.assign(static_cast<std::size_t>(comm.size), 0);
  }
  void*& slot = comm.p2p_channels[index];
  if (slot == nullptr) {
    P2PChannel& ch = open_p2p_channel(*comm.arena, p2p_channel_name(comm.name, from, to), from_global, to_global);
    if (bridge && from == comm.rank) {
      std::uint64_t entry = bridge->p2p_registered.load(std::memory_order_acquire);
      do {
        if (entry >= bridge->p2p_capacity) {
          throw UsageError(fmt::format("send to rank {} on communicator '{}': this node's ranks already send to {} ranks "
                                       "of other nodes (pairs and communicators), the most nodalrun provides for",
                                       to, comm.name, bridge->p2p_capacity));
        }
      } while (!bridge->p2p_registered.compare_exchange_weak(entry, entry + 1, std::memory_order_acq_rel));
      auto* table = static_cast<std::atomic<std::uint64_t>*>(comm.arena->at(bridge->p2p_table_offset));
      table[entry].store(comm.arena->offset_of(&ch) + 1, std::memory_order_release);
      notify(bridge->word);
    }
    slot = &ch;
  }
  auto& ch = *static_cast<P2PChannel*>(slot);
  return bridge ? Endpoint{ch, bridge->word, bridge} : Endpoint{ch, comm.shared->word, nullptr};
}

/// While a rank is inside a send/recv with another node's rank: the agent then polls for it.
class AcrossNodes {
 public:
  explicit AcrossNodes(NodeBridge* bridge) : bridge_(bridge) {
    if (!bridge_) return;
    bridge_->p2p_active.fetch_add(1, std::memory_order_acq_rel);
    notify(bridge_->word);
  }
  ~AcrossNodes() {
    if (bridge_) bridge_->p2p_active.fetch_sub(1, std::memory_order_acq_rel);
  }
  AcrossNodes(const AcrossNodes&) = delete;
  AcrossNodes& operator=(const AcrossNodes&) = delete;

 private:
  NodeBridge* bridge_;
};

/// Waits until `ready`; across nodes the rank yields its core to the agent and the network.
template <class Ready>
void wait_for(const Endpoint& e, Ready&& ready, const char* what) {
  wait_until(e.word, std::forward<Ready>(ready), Deadline{}, what, /*yield_core=*/e.bridge != nullptr);
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
}

}  // namespace

void send_message(CommState& comm, const void* input, std::size_t count, DType dtype, int peer, int tag) {
  check_peer(comm, peer, "send");
  const P2PCall described{comm, true, peer, count * element_size(dtype)};
  BlockingCall blocking(&P2PCall::describe, &described);
  check_job_alive();
  const Endpoint e = endpoint(comm, comm.rank, peer);
  AcrossNodes across(e.bridge);
  P2PChannel& ch = e.ch;
  check_channel(ch, comm, comm.rank, peer);
  const std::uint64_t message = ++comm.p2p_sent[peer];
  const std::size_t total = count * element_size(dtype);
  const std::uint64_t steps = p2p_chunks(total);
  // The previous message is fully acknowledged (send is a rendezvous), so the header is free.
  ch.count = count;
  ch.bytes = total;
  ch.dtype = dtype;
  ch.tag = tag;
  // No wake: chunk 0's publication below (at once: the ring is free) wakes the receiver.
  ch.offered.store(message, std::memory_order_release);
  for (std::uint64_t i = 0; i < steps; ++i) {
    if (i >= kP2PDepth) {
      wait_for(
          e,
          [&] { return ch.acked.load(std::memory_order_acquire) >= step_flag(message, i - kP2PDepth) || ch.broken.load(); },
          "send");
      check_channel(ch, comm, comm.rank, peer);
    }
    const std::size_t begin = i * kP2PChunk;
    const std::size_t len = std::min(kP2PChunk, total - std::min(total, begin));
    if (len != 0) std::memcpy(ch.entry(i), bytes(input) + begin, len);
    publish(e.word, ch.sent, step_flag(message, i));
  }
  wait_for(
      e, [&] { return ch.acked.load(std::memory_order_acquire) >= step_flag(message, steps - 1) || ch.broken.load(); },
      "send");
  check_channel(ch, comm, comm.rank, peer);
}

void recv_message(CommState& comm, void* output, std::size_t count, DType dtype, int peer, int tag) {
  check_peer(comm, peer, "recv");
  const P2PCall described{comm, false, peer, count * element_size(dtype)};
  BlockingCall blocking(&P2PCall::describe, &described);
  check_job_alive();
  const Endpoint e = endpoint(comm, peer, comm.rank);
  AcrossNodes across(e.bridge);
  P2PChannel& ch = e.ch;
  check_channel(ch, comm, peer, comm.rank);
  const std::uint64_t message = ++comm.p2p_received[peer];
  wait_for(e, [&] { return ch.offered.load(std::memory_order_acquire) >= message; }, "recv");
  if (ch.count != count || ch.dtype != dtype || ch.tag != tag) {
    std::uint64_t sent = ch.count;
    DType sent_dtype = ch.dtype;
    std::int32_t sent_tag = ch.tag;
    ch.broken.store(1, std::memory_order_release);
    notify(e.word);
    // A tag differing from the next message's is not a wait for a later message, as an MPI
    // recv would: the sender of this one is blocked until it is received (a rendezvous), so a
    // later one could never come.
    throw UsageError(fmt::format("recv of {} x {} (tag {}) from rank {} on communicator '{}' got a send of {} x {} "
                                 "(tag {}); messages between two ranks are matched in order; the pair's channel is "
                                 "unusable now",
                                 count, dtype_name(dtype), tag, peer, comm.name, sent, dtype_name(sent_dtype),
                                 sent_tag));
  }
  // Across nodes the agent moves no data before this, but a one-chunk message into the ring.
  ch.accepted.store(message, std::memory_order_release);
  const std::size_t total = count * element_size(dtype);
  const std::uint64_t steps = p2p_chunks(total);
  for (std::uint64_t i = 0; i < steps; ++i) {
    wait_for(e, [&] { return ch.sent.load(std::memory_order_acquire) >= step_flag(message, i); }, "recv");
    const std::size_t begin = i * kP2PChunk;
    const std::size_t len = std::min(kP2PChunk, total - std::min(total, begin));
    if (len != 0) std::memcpy(bytes(output) + begin, ch.entry(i), len);
    publish(e.word, ch.acked, step_flag(message, i));
  }
}

}  // namespace nodal::detail
