// The arena block a node's agent (nodalrun in multi-node mode, launcher/src/multinode/) shares
// with the ranks of its node: the ranks post the steps of a collective across nodes, the agent
// moves each step between the nodes (InterNode, over MPI) and says when it is done. Internal.
//
// One step: every rank of the job contributes `bytes` (uniform) or only the root does (rooted).
// A uniform step's buffer holds every rank's contribution at global_rank * bytes once the step is
// done; a rooted step's holds the root's at 0. Rank side: collectives/src/internode/; agent side:
// launcher/src/multinode/node_agent.cpp. The shape is a gather of every contribution followed by
// a local reduction in rank order, so a reduction across nodes gives the same bits as on one node
// (shm/small.cpp reduces in rank order too). Its traffic is world_size x bytes per step, not the
// 2 x bytes of a reduce-scatter + allgather: that shape (Open MPI's coll/han, UCC's cl/hier) is
// the next step for large messages.
//
// Steps are pipelined: a rank posts step s + 1 of a call before it takes step s's result, so
// that its copies (in, and the reduction out) overlap the agent's exchange of the other step.
// Buffers rotate by s % kNodeBuffers (3). A rank writes step s's buffer once every rank of its
// node has posted s - 1; each rank takes step j's result before it posts j + 2, so by then every
// rank has read step s - 3, the buffer's last user. The agent writes other nodes' parts of
// buffer s % 3 once every local rank has posted s, so after they read s - 3 too. A rank's step
// description has two slots (s % 2): it writes s + 2's after taking s's result, which the agent
// gives once it has read s's descriptions.
//
// A mismatch (the ranks' or the nodes' descriptions of step m differ) fails step m on every node:
// the agent sets `mismatch` = m; each rank that waits for m (or m + 1, which it may have posted)
// throws UsageError, having first moved its `posted` to m + 1 and acknowledged in `resynced`; once
// every rank of the node has, the agent marks m + 1 done (it is never exchanged), clears `mismatch`
// and goes on with m + 2 (every node skips the same step): the communicator works on, as on one node.
#pragma once

#include <nodal/detail/wait.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace nodal::detail {

/// The block's name in the arena (Arena::find_or_create); made by the agent before ranks start.
inline constexpr const char* kNodeBridgeName = "nodal.node_bridge";
/// The size of each step buffer, bytes (NODAL_NODE_BUFFER_BYTES overrides).
inline constexpr std::size_t kNodeBufferBytes = 8u << 20;
/// Step buffers, used in turn (see above).
inline constexpr int kNodeBuffers = 3;

/// What one step is; every rank of every node posts the same one, or the step fails as a mismatch.
struct BridgeStep {
  std::uint8_t kind = 0;   ///< the call's CollKind
  std::uint8_t dtype = 0;  ///< the call's DType
  std::uint8_t op = 0;     ///< the call's ReduceOp (0 for calls that do not reduce), | kOnGpu
  static constexpr std::uint8_t kOnGpu = 0x80;  ///< in `op`: a call on cuda tensors (only agreed here)
  std::uint8_t rooted = 0; ///< 1: only `root` contributes
  std::int32_t root = -1;  ///< global rank; -1 for calls without one
  std::uint64_t count = 0; ///< the call's count argument
  std::uint64_t bytes = 0; ///< this step's bytes per contributor
  std::uint64_t call = 0;  ///< the call's number on the communicator (1, 2, ...)
  char name[16] = {};      ///< the call's name ("allreduce"), for the agent's messages
  char type[8] = {};       ///< its dtype's name ("f32"), likewise
  bool operator==(const BridgeStep&) const = default;
};
static_assert(sizeof(BridgeStep) == 56);

/// "allreduce #3 of 4 x f32, root 0, on cuda tensors" (the op's name, when given, after the
/// dtype), for the messages of a mismatch.
inline std::string describe_bridge_step(const BridgeStep& s, std::string_view op_name = {}) {
  std::string text = fmt::format("{} #{} of {} x {}", std::string(s.name, strnlen(s.name, sizeof s.name)), s.call, s.count,
                                 std::string(s.type, strnlen(s.type, sizeof s.type)));
  if (!op_name.empty()) text += fmt::format(", {}", op_name);
  if (s.root >= 0) text += fmt::format(", root {}", s.root);
  if (s.op & BridgeStep::kOnGpu) text += ", on cuda tensors";
  return text;
}

/// One rank's line.
struct alignas(64) BridgeRank {
  std::atomic<std::uint64_t> posted{0};  ///< the last step whose contribution this rank wrote
  BridgeStep steps[2];                   ///< what it posted: step s at s % 2 (written before `posted`)
  std::atomic<std::uint64_t> resynced{0};  ///< the last failed step this rank has seen (see above)
};

struct NodeBridge {
  static constexpr std::uint64_t kMagic = 0x6567646972622d6fULL;  // changed with the layout
  std::uint64_t magic = kMagic;
  std::int32_t node_rank = 0;
  std::int32_t nnodes = 1;
  std::int32_t local_size = 1;   ///< ranks on this node; `ranks` has as many lines
  std::int32_t world_size = 1;
  std::int32_t first_rank = 0;   ///< the global rank of local rank 0 (torchrun's prefix sum)
  std::uint64_t capacity = 0;    ///< bytes of each step buffer
  std::uint64_t buffer_offset[kNodeBuffers] = {};  ///< arena offsets; step s uses s % kNodeBuffers
  /// The last step the agent finished. Ranks wait for it; `word` wakes them.
  alignas(64) std::atomic<std::uint64_t> done{0};
  /// The step that failed because the calls did not match (`message` says how), until every rank
  /// of the node has seen it; 0 when none.
  std::atomic<std::uint64_t> mismatch{0};
  char message[480] = {};
  /// Ranks notify it after a post, the agent after a step; and the flags of send/recv with
  /// another node's ranks (nodal/detail/p2p_channel.hpp) notify it too.
  alignas(64) WaitWord word;

  // send/recv with ranks of other nodes (the agent moves them: launcher/src/multinode/p2p_relay.hpp).
  /// Arena offset of p2p_capacity std::atomic<std::uint64_t>: the arena offsets + 1 of the
  /// channels (nodal/detail/p2p_channel.hpp) this node's ranks send on to ranks of other nodes,
  /// in the order they were first used (0: claimed, not written yet).
  std::uint64_t p2p_table_offset = 0;
  std::uint64_t p2p_capacity = 0;
  /// Entries claimed so far (a rank claims one with fetch_add, then writes it).
  alignas(64) std::atomic<std::uint64_t> p2p_registered{0};
  /// Ranks of this node now inside a send or recv with another node's rank: the agent does not
  /// sleep while there are any.
  std::atomic<std::int32_t> p2p_active{0};

  BridgeRank* ranks() { return reinterpret_cast<BridgeRank*>(this + 1); }
  static std::size_t bytes_for(int local_size) {
    return sizeof(NodeBridge) + sizeof(BridgeRank) * static_cast<std::size_t>(local_size);
  }
};
static_assert(sizeof(NodeBridge) % alignof(BridgeRank) == 0);

}  // namespace nodal::detail
