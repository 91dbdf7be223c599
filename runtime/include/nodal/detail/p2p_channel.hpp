// The arena block of one direction of send/recv between two ranks (collectives/src/shm/
// point_to_point.cpp), shared with nodalrun's agent, which plays the missing end of a pair that
// spans nodes (launcher/src/multinode/p2p_relay.cpp). Internal.
//
// Message m (1, 2, ... per direction) goes as follows. The sender writes the header (count,
// dtype, tag, bytes) and publishes `offered` = m; the receiver checks the header against its recv and
// publishes `accepted` = m, or sets `broken` (a mismatch: both sides throw UsageError, and the
// direction stays unusable). Data moves in chunks of kP2PChunk bytes through a ring of kP2PDepth
// entries: the sender copies chunk i into entry i % kP2PDepth and publishes `sent` =
// step_flag(m, i); the receiver copies it out and publishes `acked` = step_flag(m, i). The sender
// returns once the last chunk is acked (a rendezvous, as MPI_Ssend), so the header is free for
// message m + 1 by then. A message of 0 bytes has one chunk of 0 bytes.
//
// Across nodes the same-named block exists in both nodes' arenas: on the sender's node the agent
// is its receiver, on the receiver's node its sender, and the agents move the header, the verdict
// and the chunks between them (p2p_relay.hpp).
#pragma once

#include <nodal/tensor.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace nodal::detail {

/// A flag value: step `step` of call (or message) `seq`; they only grow. Steps < kMaxSteps.
inline std::uint64_t step_flag(std::uint64_t seq, std::uint64_t step) { return (seq << 24) | (step + 1); }
inline constexpr std::uint64_t kMaxSteps = (1u << 24) - 2;

inline constexpr std::size_t kP2PChunk = 256 * 1024;  ///< bytes per ring entry
inline constexpr std::size_t kP2PDepth = 2;           ///< ring entries
inline constexpr std::size_t kP2PHeader = 4096;       ///< the channel's own bytes before its ring
inline constexpr std::size_t kP2PChannelBytes = kP2PHeader + kP2PDepth * kP2PChunk;

inline constexpr std::size_t kP2PNameBytes = 160;  ///< room for a channel's name, its NUL included

struct P2PChannel {
  alignas(64) std::atomic<std::uint64_t> offered{0};   ///< the message whose header is written
  alignas(64) std::atomic<std::uint64_t> accepted{0};  ///< the message whose header the receiver accepted
  alignas(64) std::atomic<std::uint64_t> sent{0};      ///< step_flag(message, chunk) staged
  alignas(64) std::atomic<std::uint64_t> acked{0};     ///< step_flag(message, chunk) copied out
  alignas(64) std::uint64_t count = 0;                 ///< elements of the offered message
  std::uint64_t bytes = 0;                             ///< its bytes (count x the dtype's size)
  DType dtype = DType::u8;
  std::int32_t tag = 0;
  std::atomic<std::uint32_t> broken{0};  ///< a mismatch was seen: the channel is unusable
  // Written by whoever makes the channel (a rank or, across nodes, the receiver's agent).
  std::int32_t from_global = -1;  ///< the sender's global rank
  std::int32_t to_global = -1;    ///< the receiver's
  char name[kP2PNameBytes] = {};  ///< p2p_channel_name()

  /// Ring entry of chunk `chunk`.
  std::byte* entry(std::uint64_t chunk) {
    return reinterpret_cast<std::byte*>(this) + kP2PHeader + (chunk % kP2PDepth) * kP2PChunk;
  }
};
static_assert(sizeof(P2PChannel) <= kP2PHeader);

/// Chunks of a message of `bytes` (at least one).
inline std::uint64_t p2p_chunks(std::uint64_t bytes) {
  return bytes == 0 ? 1 : (bytes + kP2PChunk - 1) / kP2PChunk;
}

/// The channel's name in the arena: direction from -> to (ranks of the communicator) of
/// communicator `comm`. Throws std::length_error beyond kP2PNameBytes - 1 characters.
inline std::string p2p_channel_name(const std::string& comm, int from, int to) {
  std::string name = fmt::format("nodal.p2p:{}:{}-{}", comm, from, to);
  if (name.size() >= kP2PNameBytes) throw std::length_error("send/recv channel name too long: " + name);
  return name;
}

/// Finds or makes the channel `name` in `arena` (any process of the node, at any time).
template <class ArenaT>
P2PChannel& open_p2p_channel(ArenaT& arena, const std::string& name, int from_global, int to_global) {
  void* where = arena.find_or_create(name.c_str(), kP2PChannelBytes, 4096, [&](void* p) {
    auto* ch = new (p) P2PChannel();
    ch->from_global = from_global;
    ch->to_global = to_global;
    name.copy(ch->name, sizeof ch->name - 1);
  });
  return *static_cast<P2PChannel*>(where);
}

}  // namespace nodal::detail
