// A reduction step in the folded shape (nodal/detail/node_bridge.hpp): the agents fold the
// contributions along the chain of nodes, in rank order, and the last node's fold (the result)
// goes back along the chain to every node. Every node's agent folds once, with the ranks' own
// kernels (collectives/src/reduce_kernels.hpp): the one-node path's arithmetic, so the one-node bits.
//
// Pipelined by segments (the classic pipelined chain, e.g. Träff's and Patarasuk & Yuan's
// bandwidth-optimal allreduce analyses): in tick t, node k folds segment t - k, and a segment's
// result reaches node k in tick t = segment + 2 (K - 1) - k. So partials of later segments go
// down the chain while results of earlier ones come back up it: both directions of every link
// busy at once. (Within a node a tick's fold follows its transfers: overlapping them is not done.)
#include "multinode/node_agent.hpp"

#include <nodal/detail/float_mode.hpp>
#include <nodal/detail/node_bridge.hpp>

#include "reduce_kernels.hpp"

#include <algorithm>
#include <vector>

namespace nodal::launcher {
namespace {

/// Bytes per segment of a folded step (at least; the step is cut into equal segments of whole
/// elements). Each tick costs a round of messages between the agents (tens of microseconds here),
/// so segments are not made smaller than this.
constexpr std::size_t kSegmentBytes = 256 << 10;

}  // namespace

bool NodeAgent::fold_step(const detail::BridgeStep& step, std::byte* buffer, std::uint32_t float_mode) {
  const auto dtype = static_cast<DType>(step.dtype);
  const auto op = static_cast<ReduceOp>(step.op & ~detail::BridgeStep::kOnGpu);
  const std::size_t es = element_size(dtype);
  const std::size_t elements = step.bytes / es;
  const long segments = static_cast<long>(std::max<std::size_t>(1, step.bytes / kSegmentBytes));
  const std::size_t per_segment = (elements + static_cast<std::size_t>(segments) - 1) / static_cast<std::size_t>(segments);
  const NodeInfo& me = nodes_[static_cast<std::size_t>(node_rank_)];
  const int k = node_rank_;
  const int last_node = nnodes() - 1;
  const int end = me.first_rank + me.local_size;  // one past this node's last rank
  // Slot j holds rank j's contribution; this node's partial goes to its last rank's slot, the
  // partial from node k - 1 arrives in the slot before its first rank's, the result is in the last.
  auto at = [&](int slot, long segment) {
    return buffer + static_cast<std::size_t>(slot) * step.bytes + static_cast<std::size_t>(segment) * per_segment * es;
  };
  // Every segment holds elements: per_segment x (segments - 1) < elements, as a segment is at
  // least kSegmentBytes / es elements.
  auto length = [&](long segment) {
    return std::min(per_segment, elements - static_cast<std::size_t>(segment) * per_segment) * es;
  };
  const int partial_in = me.first_rank - 1, partial_out = end - 1, result = world_size_ - 1;
  const int from = k > 0 ? partial_in : me.first_rank;
  auto valid = [&](long segment) { return segment >= 0 && segment < segments; };
  std::vector<nodal_internode_transfer> transfers;
  std::vector<const void*> srcs;
  const long ticks = segments + 2L * last_node;
  for (long t = 0; t < ticks; ++t) {
    const long fold = t - k;                        // the segment this node folds in tick t
    const long back = t - (2L * last_node - k);     // the result that reaches it in tick t
    transfers.clear();
    constexpr int kRecv = NODAL_INTERNODE_RECV, kSend = NODAL_INTERNODE_SEND;
    if (k > 0 && valid(fold)) transfers.push_back({k - 1, kRecv, at(partial_in, fold), length(fold), 0});
    if (k < last_node && valid(fold - 1)) {
      transfers.push_back({k + 1, kSend, at(partial_out, fold - 1), length(fold - 1), 0});
    }
    if (k < last_node && valid(back)) transfers.push_back({k + 1, kRecv, at(result, back), length(back), 0});
    if (k > 0 && valid(back - 1)) transfers.push_back({k - 1, kSend, at(result, back - 1), length(back - 1), 0});
    if (!transfers.empty()) {
      engine_->exchange_start(transfers);
      wait_collective(true);
      if (stopping()) return false;
    }
    if (valid(fold)) {
      const detail::FloatModeScope mode(float_mode);  // the ranks' arithmetic, not nodalrun's
      srcs.clear();
      for (int j = from; j < end; ++j) srcs.push_back(at(j, fold));
      detail::reduce_n(dtype, op, at(partial_out, fold), srcs.data(), static_cast<int>(srcs.size()), length(fold) / es);
    }
  }
  return true;
}

}  // namespace nodal::launcher
