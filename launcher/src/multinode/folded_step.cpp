// A reduction step in the folded shape (nodal/detail/node_bridge.hpp): the agents fold the
// contributions along the chain of nodes, in rank order, and the last node's fold (the result)
// goes to every node. Every node's agent folds once, with the ranks' own kernels
// (collectives/src/reduce_kernels.hpp): the one-node path's arithmetic, so the one-node bits.
#include "multinode/node_agent.hpp"

#include <nodal/detail/node_bridge.hpp>

#include "reduce_kernels.hpp"

#include <vector>

namespace nodal::launcher {

bool NodeAgent::fold_step(const detail::BridgeStep& step, std::byte* buffer) {
  const auto dtype = static_cast<DType>(step.dtype);
  const auto op = static_cast<ReduceOp>(step.op & ~detail::BridgeStep::kOnGpu);
  const std::size_t bytes = step.bytes;
  auto slot = [&](int j) { return buffer + static_cast<std::size_t>(j) * bytes; };
  const NodeInfo& me = nodes_[static_cast<std::size_t>(node_rank_)];
  const int end = me.first_rank + me.local_size;  // one past this node's last rank
  const int last_node = nnodes() - 1;
  // The partial of the nodes before this one arrives in the slot before this node's first rank.
  int from = me.first_rank;
  if (node_rank_ > 0) {
    from = me.first_rank - 1;
    engine_->sendrecv_start(-1, nullptr, 0, node_rank_ - 1, slot(from), bytes);
    wait_collective(true);
    if (stopping()) return false;
  }
  std::vector<const void*> srcs;
  for (int j = from; j < end; ++j) srcs.push_back(slot(j));
  detail::reduce_n(dtype, op, slot(end - 1), srcs.data(), static_cast<int>(srcs.size()),
                   bytes / element_size(dtype));
  if (node_rank_ < last_node) {
    engine_->sendrecv_start(node_rank_ + 1, slot(end - 1), bytes, -1, nullptr, 0);
    wait_collective(true);
    if (stopping()) return false;
  }
  // The last node's fold is the result, at the last slot: to every node.
  engine_->broadcast_start(slot(world_size_ - 1), bytes, last_node);
  wait_collective(true);
  return !stopping();
}

}  // namespace nodal::launcher
