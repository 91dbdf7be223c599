#include "multinode/p2p_relay.hpp"

#include <nodal/detail/node_bridge.hpp>
#include <nodal/detail/p2p_channel.hpp>
#include <nodal/detail/wait.hpp>

#include <algorithm>
#include <cstring>
#include <set>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace nodal::launcher {

using detail::P2PChannel;
using detail::step_flag;

namespace {

enum Kind : std::uint8_t { kHeader = 1, kClear = 2, kNack = 3, kFin = 4 };

}  // namespace

/// A notice between the agents. A header is followed by the channel's name (name_bytes) and,
/// inline, by the message's bytes.
struct P2PRelay::Control {
  char letter = kNotice;
  std::uint8_t kind = 0;
  std::uint8_t dtype = 0;
  std::uint8_t inlined = 0;    ///< 1: the message's bytes follow
  std::int32_t wire = 0;       ///< the channel's number from the sender's node to the receiver's: its chunks' tag
  std::int32_t tag = 0;        ///< the user's tag
  std::int32_t from = 0;       ///< global ranks
  std::int32_t to = 0;
  std::uint32_t name_bytes = 0;
  std::uint64_t message = 0;
  std::uint64_t count = 0;
  std::uint64_t bytes = 0;

  /// With every byte set, padding included (it goes over the wire).
  static Control make(std::uint8_t kind) {
    Control c;
    std::memset(static_cast<void*>(&c), 0, sizeof c);
    c.letter = kNotice;
    c.kind = kind;
    return c;
  }
};

/// One direction between a rank of this node and one of another node.
struct P2PRelay::Pair {
  enum class State {
    idle,       ///< between messages
    offered,    ///< outbound: header sent, waiting for the receiver's agent; inbound: header published
    streaming,  ///< chunks under way
    finishing,  ///< inbound: every chunk arrived (or inline), waiting for the rank's last ack
    broken,     ///< a mismatch: the direction is unusable
  };
  bool outbound = false;  ///< the sender is on this node
  int from = 0;           ///< global ranks
  int to = 0;
  int peer_node = 0;      ///< the other end's node
  int wire = 0;           ///< Control::wire
  P2PChannel* ch = nullptr;
  State state = State::idle;
  std::uint64_t message = 0;  ///< the message under way, or the last one
  std::uint64_t bytes = 0;
  std::uint64_t chunks = 0;
  bool inlined = false;
  std::uint64_t posted = 0;     ///< chunks given to the engine
  std::uint64_t completed = 0;  ///< chunks done, in order
  std::set<std::uint64_t> early;  ///< chunks done ahead of an earlier one
  bool fin = false;             ///< outbound: the receiver's agent said "fin"

  std::uint64_t chunk_bytes(std::uint64_t i) const {
    const std::uint64_t begin = i * detail::kP2PChunk;
    return std::min<std::uint64_t>(detail::kP2PChunk, bytes - std::min(bytes, begin));
  }
};

P2PRelay::P2PRelay(Arena& arena, detail::NodeBridge& bridge, InterNode& engine, std::vector<int> bounds, int node_rank)
    : arena_(arena),
      bridge_(bridge),
      engine_(engine),
      bounds_(std::move(bounds)),
      node_rank_(node_rank),
      tag_limit_(engine.p2p_tag_limit()),
      next_wire_(bounds_.size(), 0) {}

P2PRelay::~P2PRelay() = default;

int P2PRelay::node_of(int rank) const {
  const auto it = std::upper_bound(bounds_.begin(), bounds_.end(), rank);
  return static_cast<int>(it - bounds_.begin()) - 1;
}

bool P2PRelay::busy() const {
  if (bridge_.p2p_active.load(std::memory_order_acquire) > 0 || !operations_.empty()) return true;
  if (bridge_.p2p_registered.load(std::memory_order_acquire) != registered_) return true;
  return std::any_of(pairs_.begin(), pairs_.end(), [](const std::unique_ptr<Pair>& p) {
    return p->state != Pair::State::idle && p->state != Pair::State::broken;
  });
}

void P2PRelay::discover() {
  const std::uint64_t registered = bridge_.p2p_registered.load(std::memory_order_acquire);
  const auto* table = static_cast<const std::atomic<std::uint64_t>*>(arena_.at(bridge_.p2p_table_offset));
  for (; registered_ < registered; ++registered_) {
    const std::uint64_t offset = table[registered_].load(std::memory_order_acquire);
    if (offset == 0) return;  // claimed by a rank that has not written it yet: next time
    auto pair = std::make_unique<Pair>();
    pair->outbound = true;
    pair->ch = static_cast<P2PChannel*>(arena_.at(offset - 1));
    pair->from = pair->ch->from_global;
    pair->to = pair->ch->to_global;
    pair->peer_node = node_of(pair->to);
    pair->wire = next_wire_[static_cast<std::size_t>(pair->peer_node)]++;
    if (pair->wire > tag_limit_) {
      throw std::runtime_error(fmt::format("send/recv across nodes: more than {} channels from node {} to node {} ({}'s "
                                           "largest tag)",
                                           tag_limit_, node_rank_, pair->peer_node, engine_.engine()));
    }
    outbound_[{pair->peer_node, pair->wire}] = pair.get();
    pairs_.push_back(std::move(pair));
  }
}

void P2PRelay::reply(const Pair& p, std::uint8_t kind) {
  Control c = Control::make(kind);
  c.wire = p.wire;
  c.from = p.from;
  c.to = p.to;
  c.message = p.message;
  engine_.send_notice(p.peer_node, std::string_view(reinterpret_cast<const char*>(&c), sizeof c));
  ++activity_;
}

void P2PRelay::on_notice(int from_node, std::string_view notice) {
  ++activity_;
  static_assert(sizeof(Control) + detail::kP2PNameBytes + kInlineBytes <= InterNode::kNoticeBytes,
                "a header with its inline data fits in a notice (InterNode::poll_notice)");
  Control c;
  if (notice.size() < sizeof c) throw std::runtime_error("a truncated send/recv notice between nodes");
  std::memcpy(&c, notice.data(), sizeof c);
  if (c.kind == kHeader) {
    if (c.name_bytes >= detail::kP2PNameBytes || notice.size() != sizeof c + c.name_bytes + (c.inlined ? c.bytes : 0)) {
      throw std::runtime_error("a send/recv notice of the wrong size");
    }
    Pair*& found = inbound_[{from_node, c.wire}];
    if (!found) {
      // The receiving rank may not have called recv yet: the agent makes the channel (once per
      // channel in the job's life; the rank finds it by name).
      auto pair = std::make_unique<Pair>();
      pair->from = c.from;
      pair->to = c.to;
      pair->peer_node = from_node;
      pair->wire = c.wire;
      pair->ch = &detail::open_p2p_channel(arena_, std::string(notice.substr(sizeof c, c.name_bytes)), c.from, c.to);
      found = pair.get();
      pairs_.push_back(std::move(pair));
    }
    Pair& p = *found;
    if (p.state != Pair::State::idle || c.message != p.message + 1) {
      throw std::runtime_error(fmt::format("send/recv {} -> {}: message {} came from node {} while message {} was under way",
                                           c.from, c.to, c.message, from_node, p.message));
    }
    p.message = c.message;
    p.bytes = c.bytes;
    p.chunks = detail::p2p_chunks(c.bytes);
    p.inlined = c.inlined != 0;
    p.posted = p.completed = 0;
    p.early.clear();
    P2PChannel& ch = *p.ch;
    ch.count = c.count;
    ch.bytes = c.bytes;
    ch.dtype = static_cast<DType>(c.dtype);
    ch.tag = c.tag;
    if (p.inlined) {
      std::memcpy(ch.entry(0), notice.data() + sizeof c + c.name_bytes, c.bytes);
      ch.offered.store(p.message, std::memory_order_release);
      ch.sent.store(step_flag(p.message, 0), std::memory_order_release);
      p.state = Pair::State::finishing;
    } else {
      // A message of one chunk is sent without waiting for "clear to send" (into entry 0, free
      // since the last message's fin): its receive goes at once and completes whatever D says.
      if (p.chunks == 1) post_chunk(p);
      ch.offered.store(p.message, std::memory_order_release);
      p.state = Pair::State::offered;
    }
    detail::notify(bridge_.word);
    return;
  }
  const auto it = outbound_.find({from_node, c.wire});
  if (it == outbound_.end() || it->second->message != c.message) {
    throw std::runtime_error(fmt::format("send/recv {} -> {}: an answer for message {} that this node did not send",
                                         c.from, c.to, c.message));
  }
  Pair& p = *it->second;
  switch (c.kind) {
    case kClear:
      p.state = Pair::State::streaming;
      break;
    case kNack:
      p.state = Pair::State::broken;
      p.ch->broken.store(1, std::memory_order_release);
      detail::notify(bridge_.word);
      break;
    case kFin:
      p.fin = true;
      if (p.inlined) p.state = Pair::State::streaming;  // settled below, with nothing in flight
      break;
    default: throw std::runtime_error("an unknown send/recv notice between nodes");
  }
  progress_outbound(p);
}

void P2PRelay::progress_outbound(Pair& p) {
  P2PChannel& ch = *p.ch;
  if (p.state == Pair::State::idle) {
    const std::uint64_t m = p.message + 1;
    if (ch.offered.load(std::memory_order_acquire) < m) return;
    const std::uint64_t bytes = ch.bytes;
    const bool inlined = bytes <= kInlineBytes;
    // Inline data rides in the notice, once the rank has staged it (right after its header).
    if (inlined && ch.sent.load(std::memory_order_acquire) < step_flag(m, 0)) return;
    p.message = m;
    p.bytes = bytes;
    p.chunks = detail::p2p_chunks(bytes);
    p.inlined = inlined;
    p.fin = false;
    p.posted = p.completed = 0;
    p.early.clear();
    Control c = Control::make(kHeader);
    c.dtype = static_cast<std::uint8_t>(ch.dtype);
    c.inlined = inlined ? 1 : 0;
    c.wire = p.wire;
    c.from = p.from;
    c.to = p.to;
    c.tag = ch.tag;
    c.message = m;
    c.count = ch.count;
    c.bytes = bytes;
    const std::string_view name(ch.name, strnlen(ch.name, sizeof ch.name));
    c.name_bytes = static_cast<std::uint32_t>(name.size());
    std::string notice(reinterpret_cast<const char*>(&c), sizeof c);
    notice.append(name);
    if (inlined) notice.append(reinterpret_cast<const char*>(ch.entry(0)), bytes);
    engine_.send_notice(p.peer_node, notice);
    ++activity_;
    p.state = Pair::State::offered;
  }
  // A message of one chunk goes as soon as the rank has staged it, clear to send or not, and
  // after a "nack" too: D's agent receives it whatever D says. Longer ones once D has accepted
  // (sending their chunk 0 early too was 0.83-0.96x at 512 KiB-1 MiB on 2 x 2 ranks).
  if ((p.state == Pair::State::offered || p.state == Pair::State::broken) && p.chunks == 1 && !p.inlined &&
      p.posted == 0 &&
      ch.sent.load(std::memory_order_acquire) >= step_flag(p.message, 0)) {
    post_chunk(p);
  }
  if (p.state != Pair::State::streaming) return;
  while (!p.inlined && p.posted < p.chunks && p.posted - p.completed < detail::kP2PDepth &&
         ch.sent.load(std::memory_order_acquire) >= step_flag(p.message, p.posted)) {
    post_chunk(p);
  }
  // Done once every chunk has left and the receiver's agent says the rank has it all.
  if (p.fin && (p.inlined || p.completed == p.chunks)) {
    ch.acked.store(step_flag(p.message, p.chunks - 1), std::memory_order_release);
    p.state = Pair::State::idle;
    detail::notify(bridge_.word);
  }
}

void P2PRelay::progress_inbound(Pair& p) {
  P2PChannel& ch = *p.ch;
  switch (p.state) {
    case Pair::State::offered:
      if (ch.broken.load(std::memory_order_acquire) != 0) {
        reply(p, kNack);
        p.state = Pair::State::broken;
      } else if (ch.accepted.load(std::memory_order_acquire) >= p.message) {
        reply(p, kClear);
        p.state = Pair::State::streaming;
      }
      return;
    case Pair::State::streaming: {
      while (p.posted < p.chunks && p.posted - p.completed < detail::kP2PDepth &&
             (p.posted < detail::kP2PDepth ||
              ch.acked.load(std::memory_order_acquire) >= step_flag(p.message, p.posted - detail::kP2PDepth))) {
        post_chunk(p);
      }
      if (p.completed == p.chunks) p.state = Pair::State::finishing;
      [[fallthrough]];
    }
    case Pair::State::finishing:
      if (p.state != Pair::State::finishing) return;
      if (ch.broken.load(std::memory_order_acquire) != 0) {  // an inline message that did not match
        reply(p, kNack);
        p.state = Pair::State::broken;
      } else if (ch.acked.load(std::memory_order_acquire) >= step_flag(p.message, p.chunks - 1)) {
        reply(p, kFin);
        p.state = Pair::State::idle;
      }
      return;
    default: return;
  }
}

void P2PRelay::post_chunk(Pair& p) {
  const std::uint64_t cookie = next_cookie_++;
  operations_[cookie] = {&p, p.posted};
  if (p.outbound) {
    engine_.p2p_isend(p.peer_node, p.wire, p.ch->entry(p.posted), p.chunk_bytes(p.posted), cookie);
  } else {
    engine_.p2p_irecv(p.peer_node, p.wire, p.ch->entry(p.posted), p.chunk_bytes(p.posted), cookie);
  }
  ++activity_;
  ++p.posted;
}

void P2PRelay::complete(std::uint64_t cookie) {
  const auto it = operations_.find(cookie);
  if (it == operations_.end()) return;
  auto [p, chunk] = it->second;
  operations_.erase(it);
  p->early.insert(chunk);
  std::uint64_t before = p->completed;
  while (!p->early.empty() && *p->early.begin() == p->completed) {
    p->early.erase(p->early.begin());
    ++p->completed;
  }
  if (p->completed == before) return;
  if (p->outbound) {
    // The chunks that have left free the sender's entries; the last one is acked on "fin".
    const std::uint64_t upto = std::min(p->completed, p->chunks - 1);
    if (upto > 0) p->ch->acked.store(step_flag(p->message, upto - 1), std::memory_order_release);
  } else {
    p->ch->sent.store(step_flag(p->message, p->completed - 1), std::memory_order_release);
  }
  detail::notify(bridge_.word);
}

void P2PRelay::progress() {
  discover();
  completed_.clear();
  if (!operations_.empty()) engine_.p2p_completed(completed_);
  activity_ += completed_.size();
  for (std::uint64_t cookie : completed_) complete(cookie);
  for (const auto& p : pairs_) {
    if (p->outbound) {
      progress_outbound(*p);
    } else {
      progress_inbound(*p);
    }
  }
}

bool P2PRelay::cancel() {
  const bool released = operations_.empty() || engine_.p2p_cancel_all();
  operations_.clear();
  return released;
}

}  // namespace nodal::launcher
