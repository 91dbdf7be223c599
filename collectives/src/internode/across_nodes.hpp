// Collectives of a communicator that spans nodes (nodalrun in multi-node mode): each call runs
// as steps through the node bridge (nodal/detail/node_bridge.hpp) that this node's agent moves
// between nodes. Internal.
#pragma once

#include "shm/algorithms.hpp"

#include <memory>
#include <vector>

namespace nodal::detail {

struct NodeBridge;

/// This process's handle on its node's bridge.
struct BridgeClient {
  Arena* arena = nullptr;
  NodeBridge* bridge = nullptr;
  std::uint64_t step = 0;  ///< steps this rank has posted
  std::uint64_t failed = 0;  ///< the last step that failed as a mismatch (node_bridge.hpp)
};

/// The world communicator of a multi-node job: rank and size are global, its calls go through
/// `bridge`; send/recv between two ranks of one node take the shared-memory path (its wake word
/// is a SharedComm of this node's arena). Throws UsageError when the agent made no bridge (a rank
/// started without nodalrun's multi-node mode but with NODAL_NNODES set).
std::shared_ptr<CommState> open_world_across_nodes(Arena& arena, int rank, int world_size);

/// Whether every rank of `ranks` (global ranks of a job across nodes; `comm` is any of its
/// communicators that spans nodes) runs on this node.
bool on_this_node(const CommState& comm, const std::vector<int>& ranks);

/// Runs `call` on a communicator made by open_world_across_nodes. Every collective, the v-variants
/// included (padded to their largest count), except calls on cuda tensors (UsageError: not across
/// nodes yet). The results are the one-node path's bits (reductions fold in rank order). Throws UsageError when the nodes' calls
/// differ, PeerFailure when the job fails while waiting.
void run_across_nodes(CommState& comm, const CollCall& call);

}  // namespace nodal::detail
