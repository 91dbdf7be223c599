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

/// A notice between the agents; a header's inline data follows it.
struct P2PRelay::Control {
  char letter = kNotice;
  std::uint8_t kind = 0;
  std::uint8_t dtype = 0;
  std::uint8_t inlined = 0;  ///< 1: the message's bytes follow
  std::int32_t from = 0;     ///< global ranks
  std::int32_t to = 0;
  std::int32_t tag = 0;      ///< the user's tag
  std::uint64_t message = 0;
  std::uint64_t count = 0;
  std::uint64_t bytes = 0;
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
  int from = 0;
  int to = 0;
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
    : arena_(arena), bridge_(bridge), engine_(engine), bounds_(std::move(bounds)), node_rank_(node_rank) {
  for (std::size_t k = 0; k + 1 < bounds_.size(); ++k) largest_node_ = std::max(largest_node_, bounds_[k + 1] - bounds_[k]);
  // A pair's data tag is sender_local * largest + receiver_local; the nodes tell the rest apart.
  const long long tags = static_cast<long long>(largest_node_) * largest_node_;
  if (tags - 1 > engine_.p2p_tag_limit()) {
    throw std::runtime_error(fmt::format("send/recv across nodes: {} ranks on a node need {} tags, and {} gives {}",
                                         largest_node_, tags, engine_.engine(), engine_.p2p_tag_limit() + 1));
  }
  known_.assign(static_cast<std::size_t>(bridge_.local_size) * static_cast<std::size_t>(bridge_.world_size), false);
}

P2PRelay::~P2PRelay() = default;

int P2PRelay::node_of(int rank) const {
  const auto it = std::upper_bound(bounds_.begin(), bounds_.end(), rank);
  return static_cast<int>(it - bounds_.begin()) - 1;
}

int P2PRelay::tag_of(int from, int to) const {
  return (from - bounds_[static_cast<std::size_t>(node_of(from))]) * largest_node_ +
         (to - bounds_[static_cast<std::size_t>(node_of(to))]);
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
  if (registered == registered_) return;
  registered_ = registered;
  const auto* table = static_cast<const std::atomic<std::uint64_t>*>(arena_.at(bridge_.p2p_table_offset));
  for (std::size_t i = 0; i < known_.size(); ++i) {
    if (known_[i]) continue;
    const std::uint64_t offset = table[i].load(std::memory_order_acquire);
    if (offset == 0) continue;
    known_[i] = true;
    auto pair = std::make_unique<Pair>();
    pair->outbound = true;
    pair->from = bridge_.first_rank + static_cast<int>(i / static_cast<std::size_t>(bridge_.world_size));
    pair->to = static_cast<int>(i % static_cast<std::size_t>(bridge_.world_size));
    pair->ch = static_cast<P2PChannel*>(arena_.at(offset - 1));
    outbound_[{pair->from, pair->to}] = pair.get();
    pairs_.push_back(std::move(pair));
  }
}

P2PRelay::Pair& P2PRelay::inbound(int from, int to) {
  Pair*& found = inbound_[{from, to}];
  if (!found) {
    auto pair = std::make_unique<Pair>();
    pair->from = from;
    pair->to = to;
    // The receiving rank may not have called recv yet: the agent makes the channel (one
    // allocation per pair in the job's life; the rank finds it by name).
    const std::string name = detail::p2p_channel_name("world", from, to);
    pair->ch = static_cast<P2PChannel*>(arena_.find_or_create(name.c_str(), detail::kP2PChannelBytes, 4096,
                                                              [](void* where) { new (where) P2PChannel(); }));
    found = pair.get();
    pairs_.push_back(std::move(pair));
  }
  return *found;
}

void P2PRelay::reply(const Pair& p, std::uint8_t kind) {
  Control c;
  c.kind = kind;
  c.from = p.from;
  c.to = p.to;
  c.message = p.message;
  engine_.send_notice(node_of(p.from), std::string_view(reinterpret_cast<const char*>(&c), sizeof c));
}

void P2PRelay::on_notice(int from_node, std::string_view notice) {
  Control c;
  static_assert(sizeof(Control) + kInlineBytes <= 1024, "a notice holds at most 1 KiB (InterNode::poll_notice)");
  if (notice.size() < sizeof c) throw std::runtime_error("a truncated send/recv notice between nodes");
  std::memcpy(&c, notice.data(), sizeof c);
  if (c.kind == kHeader) {
    Pair& p = inbound(c.from, c.to);
    if (p.state != Pair::State::idle || c.message != p.message + 1) {
      throw std::runtime_error(fmt::format("send/recv {} -> {}: message {} came from {} while message {} was under way",
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
      if (notice.size() != sizeof c + c.bytes) throw std::runtime_error("a send/recv notice of the wrong size");
      std::memcpy(ch.entry(0), notice.data() + sizeof c, c.bytes);
      ch.offered.store(p.message, std::memory_order_release);
      ch.sent.store(step_flag(p.message, 0), std::memory_order_release);
      p.state = Pair::State::finishing;
    } else {
      ch.offered.store(p.message, std::memory_order_release);
      p.state = Pair::State::offered;
    }
    detail::notify(bridge_.word);
    return;
  }
  const auto it = outbound_.find({c.from, c.to});
  if (it == outbound_.end() || it->second->message != c.message) {
    throw std::runtime_error(fmt::format("send/recv {} -> {}: an answer for message {} that this node did not send",
                                         c.from, c.to, c.message));
  }
  Pair& p = *it->second;
  switch (c.kind) {
    case kClear:
      p.state = Pair::State::streaming;
      p.posted = p.completed = 0;
      p.early.clear();
      p.fin = false;
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
    // Inline data goes once the rank has staged it (right after its header).
    if (inlined && ch.sent.load(std::memory_order_acquire) < step_flag(m, 0)) return;
    p.message = m;
    p.bytes = bytes;
    p.chunks = detail::p2p_chunks(bytes);
    p.inlined = inlined;
    p.fin = false;
    Control c;
    c.kind = kHeader;
    c.dtype = static_cast<std::uint8_t>(ch.dtype);
    c.inlined = inlined ? 1 : 0;
    c.from = p.from;
    c.to = p.to;
    c.tag = ch.tag;
    c.message = m;
    c.count = ch.count;
    c.bytes = bytes;
    std::string notice(reinterpret_cast<const char*>(&c), sizeof c);
    if (inlined) notice.append(reinterpret_cast<const char*>(ch.entry(0)), bytes);
    engine_.send_notice(node_of(p.to), notice);
    p.state = Pair::State::offered;
    return;
  }
  if (p.state != Pair::State::streaming) return;
  const int dest = node_of(p.to);
  while (!p.inlined && p.posted < p.chunks && p.posted - p.completed < detail::kP2PDepth &&
         ch.sent.load(std::memory_order_acquire) >= step_flag(p.message, p.posted)) {
    const std::uint64_t cookie = next_cookie_++;
    operations_[cookie] = {&p, p.posted};
    engine_.p2p_isend(dest, tag_of(p.from, p.to), ch.entry(p.posted), p.chunk_bytes(p.posted), cookie);
    ++p.posted;
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
      const int source = node_of(p.from);
      while (p.posted < p.chunks && p.posted - p.completed < detail::kP2PDepth &&
             (p.posted < detail::kP2PDepth ||
              ch.acked.load(std::memory_order_acquire) >= step_flag(p.message, p.posted - detail::kP2PDepth))) {
        const std::uint64_t cookie = next_cookie_++;
        operations_[cookie] = {&p, p.posted};
        engine_.p2p_irecv(source, tag_of(p.from, p.to), ch.entry(p.posted), p.chunk_bytes(p.posted), cookie);
        ++p.posted;
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
  for (std::uint64_t cookie : completed_) complete(cookie);
  for (const auto& p : pairs_) {
    if (p->outbound) {
      progress_outbound(*p);
    } else {
      progress_inbound(*p);
    }
  }
}

void P2PRelay::cancel() {
  if (!operations_.empty()) engine_.p2p_cancel_all();
  operations_.clear();
}

}  // namespace nodal::launcher
