// send/recv between ranks of different nodes, the agents' side. A rank uses its channel
// (nodal/detail/p2p_channel.hpp) as it would towards a rank of its own node; the channel of
// S -> D exists in both nodes' arenas under one name, and each node's agent plays the end that
// is not on its node: on S's node the receiver, on D's node the sender. Per message m:
//
//  0. S's first send on the channel lists it in the node bridge's table, where S's agent finds it.
//     Channels are per communicator: any communicator's send/recv crosses nodes this way.
//  1. S's agent sees `offered` = m and sends the header to D's agent (a notice, 'P', naming the
//     channel), with the data when it is at most kInlineBytes (then after S has staged it); a
//     message of one chunk (up to kP2PChunk) follows as soon as S has staged it (step 4),
//     without waiting for step 3.
//  2. D's agent writes the header into D's channel (making the channel if D has not yet),
//     posts the receive of a one-chunk message into D's ring (free since the last message's fin)
//     and publishes `offered` (and chunk 0, inline). D checks it as on one node: `accepted`, or
//     `broken` (a mismatch).
//  3. D's agent answers: "clear to send" on `accepted` (the chunks after 0 may go), "nack" on `broken`,
//     "fin" once D has acked the last chunk. On "nack" S's agent sets S's `broken`: both ranks
//     throw the one-node UsageError and the direction stays unusable. A one-chunk message sent
//     before the "nack" is still received into D's ring (drained, also at the job's end:
//     NodeAgent::end_p2p).
//  4. Chunks go straight from S's ring to D's ring through the engine (MPI_Isend / MPI_Irecv on
//     the channel's own tag, numbered by S's agent), kP2PDepth in flight: S's agent acks chunk i
//     (freeing S's entry) when its send has completed, D's agent posts the receive of chunk i
//     once D has acked chunk i - kP2PDepth, and publishes `sent` when it arrives.
//  5. On "fin" S's agent acks the last chunk: S's send returns after D has the whole message,
//     the rendezvous of one node.
//
// Nothing is copied in the agent but inline data; before the receiver accepted the header only
// a message of one chunk moves (inline, or sent beside the header), into the receiver's ring, not
// its buffer: one round trip between the nodes fewer (64-256 KiB ping-pong 1.24-1.60x faster,
// bench/results/2026-11-28-p2p-one-chunk.md). Every call is non-blocking and runs on the agent's
// thread, between its collective steps and while one is in flight (node_agent.cpp). When the job fails the ranks' waits end in
// PeerFailure as for any call; cancel() lets go of the arena memory the engine holds.
#pragma once

#include <nodal/arena.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "multinode/internode.hpp"

namespace nodal::detail {
struct NodeBridge;
struct P2PChannel;
}  // namespace nodal::detail

namespace nodal::launcher {

class P2PRelay {
 public:
  /// Notices for the relay start with this letter.
  static constexpr char kNotice = 'P';
  /// A message of at most this many bytes rides with its header.
  /// (One notice instead of three round trips' worth: a header, "clear to send", the data.)
  static constexpr std::size_t kInlineBytes = 32 * 1024;

  /// `bounds`: node k's global ranks are [bounds[k], bounds[k + 1]).
  P2PRelay(Arena& arena, detail::NodeBridge& bridge, InterNode& engine, std::vector<int> bounds, int node_rank);
  ~P2PRelay();
  P2PRelay(const P2PRelay&) = delete;
  P2PRelay& operator=(const P2PRelay&) = delete;

  /// Moves what can move now; never blocks.
  void progress();
  /// A notice starting with kNotice from node `from`.
  void on_notice(int from, std::string_view notice);
  /// Whether progress() should be called again soon rather than after a sleep: a rank is in a
  /// send/recv with another node, or a message is under way.
  bool busy() const;
  /// A count that grows each time a message moves (a notice arrives or is sent, a chunk is posted
  /// or completes): the agent stays hot (yields rather than naps) for a while after it grows.
  std::uint64_t activity() const { return activity_; }
  /// Whether chunks given to the engine have not completed yet.
  bool in_flight() const { return !operations_.empty(); }
  /// The job is ending: cancels the engine's operations so it holds no arena memory. False when
  /// the engine may still hold some.
  bool cancel();

 private:
  struct Pair;
  struct Control;
  void discover();
  void progress_outbound(Pair& p);
  void progress_inbound(Pair& p);
  /// Starts sending (outbound) or receiving (inbound) chunk p.posted of p's message.
  void post_chunk(Pair& p);
  void reply(const Pair& p, std::uint8_t kind);
  void complete(std::uint64_t cookie);
  int node_of(int rank) const;

  Arena& arena_;
  detail::NodeBridge& bridge_;
  InterNode& engine_;
  std::vector<int> bounds_;
  int node_rank_;
  int tag_limit_;
  std::vector<int> next_wire_;     ///< per node: the number of the next channel towards it
  std::uint64_t registered_ = 0;   ///< the bridge's table entries read so far
  std::vector<std::unique_ptr<Pair>> pairs_;
  std::map<std::pair<int, int>, Pair*> inbound_;   ///< by (sender's node, wire)
  std::map<std::pair<int, int>, Pair*> outbound_;  ///< by (receiver's node, wire)
  std::unordered_map<std::uint64_t, std::pair<Pair*, std::uint64_t>> operations_;  ///< cookie -> pair, chunk
  std::uint64_t next_cookie_ = 1;
  std::vector<std::uint64_t> completed_;
  std::uint64_t activity_ = 0;
};

}  // namespace nodal::launcher
