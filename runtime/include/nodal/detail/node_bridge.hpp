// The arena block a node's agent (nodalrun in multi-node mode, launcher/src/multinode/) shares
// with the ranks of its node: the ranks post the steps of a collective across nodes, the agent
// moves each step between the nodes (InterNode, over MPI) and says when it is done. Internal.
//
// One step: every rank of the job contributes `bytes` at global_rank * bytes of the step's
// buffer (gathered, folded) or only the root does, at 0 (rooted). Rank side:
// collectives/src/internode/; agent side: launcher/src/multinode/. Two shapes keep a reduction's
// bits those of the one-node path (shm/small.cpp and reduce_kernels.hpp fold in rank order):
// - gathered: the agents allgather every contribution, so that once the step is done the buffer
//   holds all of them on every node, and each rank reduces them in rank order. world_size x bytes
//   cross between nodes; for steps of up to the agents' small size it is one round between the
//   agents, with the steps' descriptions.
// - folded (a reduction whose chained fold is exact: see folds_exactly in across_nodes.cpp, and
//   of at least `fold_min_bytes`): the agents fold along the chain of nodes in node order. Node
//   0's agent folds its ranks' contributions into its last rank's slot and sends that partial to
//   node 1, whose agent receives it into the slot before its first rank's (node 0's last rank's),
//   folds it with its ranks' contributions, and so on; the last node's fold is the result, which
//   goes back along the chain into the last slot (world_size - 1) on every node, pipelined by
//   segments (launcher/src/multinode/folded_step.cpp). Left to right in rank order throughout:
//   the one-node bits. Each link carries the data once each way (2 x bytes in all
//   per node pair), against world_size x bytes gathered, and every node folds once instead of
//   every rank folding every contribution. (Open MPI's coll/han moves 2 x too, as reduce +
//   broadcast or reduce-scatter + allgather, but folds in the order of its trees.)
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
/// A reduction's step of this many bytes per rank or more is folded, where folding is exact
/// (NODAL_NODE_FOLD_MIN_BYTES overrides: bytes, or "off"). Measured on 2 namespace nodes
/// (bench/results/2026-11-28-multinode-folded.md): at 2 x 2 ranks folding wins from 512 KiB and
/// loses at 64-256 KiB (three rounds between agents where gathering takes one); at 2 x 1 it wins
/// from 2 MiB and ties below.
inline constexpr std::size_t kNodeFoldMinBytes = 512u << 10;
/// Step buffers, used in turn (see above).
inline constexpr int kNodeBuffers = 3;

/// How the agents move a step (see above).
enum class StepShape : std::uint8_t {
  gathered = 0,  ///< every contribution to every node
  rooted = 1,    ///< only `root` contributes: its part to every node
  folded = 2,    ///< a reduction folded along the chain of nodes: the result at the last slot
};

/// What one step is; every rank of every node posts the same one, or the step fails as a mismatch.
struct BridgeStep {
  std::uint8_t kind = 0;   ///< the call's CollKind
  std::uint8_t dtype = 0;  ///< the call's DType
  std::uint8_t op = 0;     ///< the call's ReduceOp (0 for calls that do not reduce), | kOnGpu
  static constexpr std::uint8_t kOnGpu = 0x80;  ///< in `op`: a call on cuda tensors (only agreed here)
  std::uint8_t shape = 0;  ///< a StepShape: how the agents move the step (see above)
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
  /// The posting thread's float_mode() (nodal/detail/float_mode.hpp) for step s at s % 2,
  /// written before `posted`: a folded step is folded in its node's first rank's mode, as that
  /// rank would fold it on one node. Not part of the step's description: ranks whose modes differ
  /// get what one node gives them, results folded partly in each mode.
  std::uint32_t float_mode[2] = {};
};

struct NodeBridge {
  static constexpr std::uint64_t kMagic = 0x6567646972622d71ULL;  // changed with the layout
  std::uint64_t magic = kMagic;
  std::int32_t node_rank = 0;
  std::int32_t nnodes = 1;
  std::int32_t local_size = 1;   ///< ranks on this node; `ranks` has as many lines
  std::int32_t world_size = 1;
  std::int32_t first_rank = 0;   ///< the global rank of local rank 0 (torchrun's prefix sum)
  std::uint64_t capacity = 0;    ///< bytes of each step buffer
  std::uint64_t buffer_offset[kNodeBuffers] = {};  ///< arena offsets; step s uses s % kNodeBuffers
  /// A reduction's step of this many bytes per rank or more is folded (StepShape::folded) where
  /// that is exact; the agent sets it before the ranks start: kNodeFoldMinBytes or its override,
  /// and always above the agents' small-step size (those steps ride with the descriptions in one
  /// round: up to 64 KiB per node, launcher/src/multinode/node_agent.cpp). UINT64_MAX: never
  /// (NODAL_NODE_FOLD_MIN_BYTES=off).
  std::uint64_t fold_min_bytes = 0;
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
