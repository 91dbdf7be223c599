// Collectives of a communicator that spans nodes (nodalrun in multi-node mode): each call runs
// as steps through the node bridge (nodal/detail/node_bridge.hpp) that this node's agent moves
// between nodes. Internal.
#pragma once

#include "shm/algorithms.hpp"

#include <memory>
#include <string>
#include <vector>

namespace nodal::detail {

struct NodeBridge;
struct BridgeStep;

/// This process's handle on its node's bridge.
struct BridgeClient {
  Arena* arena = nullptr;
  NodeBridge* bridge = nullptr;
  std::uint64_t step = 0;  ///< steps this rank has posted
  std::uint64_t failed = 0;  ///< the last step that failed as a mismatch (node_bridge.hpp)
  /// Set for a communicator of part of the job that spans nodes (null for the world): its calls
  /// run as send/recv around this ring (the members in order of global rank, on channels of its
  /// own, apart from the user's send/recv: group_across_nodes.cpp), not through the bridge's steps.
  std::shared_ptr<CommState> ring;
};

/// The world communicator of a multi-node job: rank and size are global, its calls go through
/// `bridge`; send/recv between two ranks of one node take the shared-memory path (its wake word
/// is a SharedComm of this node's arena). Throws UsageError when the agent made no bridge (a rank
/// started without nodalrun's multi-node mode but with NODAL_NNODES set).
std::shared_ptr<CommState> open_world_across_nodes(Arena& arena, int rank, int world_size);

/// Whether every rank of `ranks` (global ranks of a job across nodes; `comm` is any of its
/// communicators that spans nodes) runs on this node.
bool on_this_node(const CommState& comm, const std::vector<int>& ranks);

/// A communicator of part of a job that spans nodes (split or create_group of a communicator
/// made here, whose members are not all on one node): `global_ranks` in the communicator's rank
/// order, this rank at `rank`. Its calls run as send/recv between its members. `check_order`
/// (create_group, made by its members alone): the members first compare their lists; a member
/// whose order differs from that of the member with the lowest global rank gets UsageError.
std::shared_ptr<CommState> open_group_across_nodes(const CommState& parent, std::string name, int rank,
                                                   std::vector<int> global_ranks, bool check_order);

/// Runs `call` on a communicator made by open_world_across_nodes or open_group_across_nodes.
/// Every collective, the v-variants included (padded to their largest count); for a call on
/// cuda tensors (on_gpu) only the agreement: the descriptions are compared, no data moves (NCCL
/// moves it). The results are the one-node path's bits (reductions fold in rank order). Throws
/// UsageError when the nodes' calls
/// differ, PeerFailure when the job fails while waiting.
void run_across_nodes(CommState& comm, const CollCall& call);

// Shared by the two shapes (across_nodes.cpp, group_across_nodes.cpp).

/// The elements each contributor's data covers over the whole call, and whether only the root
/// contributes.
struct CallShape {
  std::size_t total = 0;
  bool rooted = false;
};
CallShape shape_of(const CollCall& call, int world_size);

/// Rank `g`'s part of the result of `call` on `n` ranks from every contribution's elements
/// [e0, e0 + e): contributor j's at buf + j * e * element size (rooted: the root's at buf).
/// Reductions fold in rank order (the one-node bits).
void take_result(const CollCall& call, int n, int g, const std::byte* buf, std::size_t e0, std::size_t e);

/// Whether the agents may fold a step of this call along the chain of nodes (node_bridge.hpp's
/// folded shape) and still give the one-node bits. Each node passes on its partial rounded to the
/// dtype, which changes nothing where the fold's accumulation type is the dtype itself (f32, f64,
/// bool; integer min and max) or rounding commutes with the fold (integer sum and prod wrap around
/// modulo 2^bits either way: reduce_kernels.hpp). Not for f16 and bf16 (accumulated in f32 and
/// rounded once) nor avg (divided by world_size at the end). Only allreduce, reduce and
/// reduce_scatter (the v-variant runs as reduce_scatter). The agents fold in the ranks'
/// floating-point mode (flushing denormals or not, the rounding direction:
/// nodal/detail/float_mode.hpp), which each rank posts with its step.
bool folds_exactly(CollKind kind, DType dtype, ReduceOp op);

/// What the steps of `call` on a communicator across nodes carry: the call's description.
BridgeStep describe_step(const CollCall& call, CollKind wire, std::uint64_t number, std::uint64_t step_bytes);

/// Runs a fixed-size call of a communicator made by open_group_across_nodes (`wire` as in
/// run_across_nodes' steps).
void exchange_in_group(CommState& comm, const CollCall& call, CollKind wire);

}  // namespace nodal::detail
