// Collectives across nodes, the ranks' side: each call is cut into steps that fit the node
// bridge's buffer; in each step every contributor writes its part of the call's data and the
// agents move the parts between nodes: gathered (every part to every node, and each rank computes
// its result from them, a reduction folding the parts in rank order as the one-node path does),
// or for a large reduction folded along the chain of nodes by the agents (the result comes back
// whole). Either way the one-node bits. See nodal/detail/node_bridge.hpp.
#include "internode/across_nodes.hpp"

#include "copy.hpp"
#include "reduce_kernels.hpp"
#include "shm/algorithm_table.hpp"
#include "shm/vector_collectives.hpp"

#include <nodal/detail/float_mode.hpp>
#include <nodal/detail/node_bridge.hpp>
#include <nodal/detail/wait_record.hpp>
#include <nodal/errors.hpp>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <optional>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace nodal::detail {

CallShape shape_of(const CollCall& call, int world_size) {
  const std::size_t n = static_cast<std::size_t>(world_size);
  switch (call.kind) {
    case CollKind::barrier: return {0, false};
    case CollKind::allreduce:
    case CollKind::reduce:
    case CollKind::allgather:
    case CollKind::gather:
    case CollKind::split: return {call.count, false};
    case CollKind::reduce_scatter:
    case CollKind::alltoall: return {call.count * n, false};
    case CollKind::broadcast: return {call.count, true};
    case CollKind::scatter: return {call.count * n, true};
    default: return {0, false};  // the v-variants run as these (run_vector)
  }
}

namespace {

/// What the wait table shows while a rank waits for a step.
struct Waiting {
  const CommState* comm;
  const CollCall* call;
  std::uint64_t number;
  std::uint64_t step;
};

void describe_waiting(const void* context, std::string& what, std::string& waiting_for) {
  const auto& w = *static_cast<const Waiting*>(context);
  const NodeBridge& b = *w.comm->across_nodes->bridge;
  what = fmt::format("{} #{} on communicator '{}' across {} nodes ({} x {})", coll_kind_name(w.call->kind), w.number,
                     w.comm->name, b.nnodes, w.call->count, dtype_name(w.call->dtype));
  std::vector<int> missing;
  auto* ranks = const_cast<NodeBridge&>(b).ranks();
  for (int j = 0; j < b.local_size; ++j) {
    if (ranks[j].posted.load(std::memory_order_acquire) < w.step) missing.push_back(b.first_rank + j);
  }
  waiting_for = missing.empty()
                    ? fmt::format("the other nodes (step {} is with this node's nodalrun)", w.step)
                    : fmt::format("ranks {} of this node to make this call", fmt::join(missing, ", "));
}

}  // namespace

void take_result(const CollCall& call, int n, int g, const std::byte* buf, std::size_t e0, std::size_t e) {
  const std::size_t es = element_size(call.dtype);
  const std::size_t step_bytes = e * es;
  auto* out = static_cast<std::byte*>(call.output);
  // The part of [e0, e0 + e) that is block `block` of count elements, as [lo, hi).
  auto block_part = [&](std::size_t block, std::size_t& lo, std::size_t& hi) {
    lo = std::max(e0, block * call.count);
    hi = std::min(e0 + e, (block + 1) * call.count);
    return lo < hi;
  };
  const auto mine = static_cast<std::size_t>(g);
  switch (call.kind) {
    case CollKind::allreduce:
    case CollKind::reduce: {
      if (call.kind == CollKind::reduce && g != call.root) return;
      std::vector<const void*> srcs(static_cast<std::size_t>(n));
      for (int j = 0; j < n; ++j) srcs[j] = buf + static_cast<std::size_t>(j) * step_bytes;
      reduce_n(call.dtype, call.op, out + e0 * es, srcs.data(), n, e);
      return;
    }
    case CollKind::reduce_scatter: {
      std::size_t lo, hi;
      if (!block_part(mine, lo, hi)) return;
      std::vector<const void*> srcs(static_cast<std::size_t>(n));
      for (int j = 0; j < n; ++j) srcs[j] = buf + static_cast<std::size_t>(j) * step_bytes + (lo - e0) * es;
      reduce_n(call.dtype, call.op, out + (lo - mine * call.count) * es, srcs.data(), n, hi - lo);
      return;
    }
    case CollKind::allgather:
    case CollKind::gather:
    case CollKind::split:
      if (call.kind == CollKind::gather && g != call.root) return;
      for (int j = 0; j < n; ++j) {
        copy_bytes(out + (static_cast<std::size_t>(j) * call.count + e0) * es, buf + static_cast<std::size_t>(j) * step_bytes,
                   step_bytes);
      }
      return;
    case CollKind::alltoall: {
      std::size_t lo, hi;
      if (!block_part(mine, lo, hi)) return;
      for (int j = 0; j < n; ++j) {
        copy_bytes(out + (static_cast<std::size_t>(j) * call.count + lo - mine * call.count) * es,
                   buf + static_cast<std::size_t>(j) * step_bytes + (lo - e0) * es, (hi - lo) * es);
      }
      return;
    }
    case CollKind::broadcast:
      if (g != call.root) copy_bytes(out + e0 * es, buf, step_bytes);
      return;
    case CollKind::scatter: {
      std::size_t lo, hi;
      if (block_part(mine, lo, hi)) copy_bytes(out + (lo - mine * call.count) * es, buf + (lo - e0) * es, (hi - lo) * es);
      return;
    }
    default: return;  // barrier
  }
}

bool folds_exactly(CollKind kind, DType dtype, ReduceOp op) {
  if (kind != CollKind::allreduce && kind != CollKind::reduce && kind != CollKind::reduce_scatter) return false;
  if (op == ReduceOp::avg) return false;
  return dtype != DType::f16 && dtype != DType::bf16;
}

BridgeStep describe_step(const CollCall& call, CollKind wire, std::uint64_t number, std::uint64_t step_bytes) {
  BridgeStep desc{static_cast<std::uint8_t>(wire),
                  static_cast<std::uint8_t>(call.dtype),
                  static_cast<std::uint8_t>(static_cast<std::uint8_t>(is_reduction(call.kind) ? call.op : ReduceOp::sum) |
                                            (call.on_gpu ? BridgeStep::kOnGpu : 0)),
                  static_cast<std::uint8_t>(shape_of(call, 1).rooted ? StepShape::rooted : StepShape::gathered),
                  call.root,
                  call.count,
                  step_bytes,
                  number,
                  {},
                  {}};
  std::strncpy(desc.name, coll_kind_name(wire), sizeof desc.name - 1);
  dtype_name(call.dtype).copy(desc.type, sizeof desc.type - 1);
  return desc;
}

std::shared_ptr<CommState> open_world_across_nodes(Arena& arena, int rank, int world_size) {
  auto* bridge = static_cast<NodeBridge*>(arena.find(kNodeBridgeName));
  if (!bridge || bridge->magic != NodeBridge::kMagic) {
    throw UsageError("the job spans nodes (NODAL_NNODES > 1) but its arena has no node bridge: start the ranks with "
                     "nodalrun under srun --mpi=pmix or mpirun, one nodalrun per node");
  }
  if (bridge->world_size != world_size || rank < bridge->first_rank || rank >= bridge->first_rank + bridge->local_size) {
    throw UsageError(fmt::format("rank {} of {} does not belong to this node's bridge (ranks {}..{} of {})", rank, world_size,
                                 bridge->first_rank, bridge->first_rank + bridge->local_size - 1, bridge->world_size));
  }
  auto state = std::make_shared<CommState>();
  state->arena = &arena;
  state->name = "world";
  state->rank = rank;
  state->size = world_size;
  state->global_ranks.resize(static_cast<std::size_t>(world_size));
  std::iota(state->global_ranks.begin(), state->global_ranks.end(), 0);
  state->config = comm_config();
  state->across_nodes = std::make_shared<BridgeClient>();
  state->across_nodes->arena = &arena;
  state->across_nodes->bridge = bridge;
  // Only its wake word is used (send/recv within this node); no slots: the calls go through the bridge.
  state->shared = static_cast<SharedComm*>(arena.find_or_create("nodal.comm-across:world", sizeof(SharedComm), kCacheLine,
                                                                [](void* where) { new (where) SharedComm{}; }));
  return state;
}

bool on_this_node(const CommState& comm, const std::vector<int>& ranks) {
  const NodeBridge& b = *comm.across_nodes->bridge;
  return std::all_of(ranks.begin(), ranks.end(),
                     [&](int r) { return r >= b.first_rank && r < b.first_rank + b.local_size; });
}

namespace {

/// Runs a fixed-size `call` through the bridge; the steps' descriptions, which the agents compare
/// between ranks and nodes, name `wire` as the call's kind (a v-variant's parts name the v-variant).
void exchange(CommState& comm, const CollCall& call, CollKind wire) {
  if (comm.across_nodes->ring) return exchange_in_group(comm, call, wire);
  BridgeClient& client = *comm.across_nodes;
  NodeBridge& b = *client.bridge;
  const std::uint64_t number = ++comm.seq;
  const int n = comm.size;
  const int g = comm.rank;
  const std::size_t es = element_size(call.dtype);
  // A call on cuda tensors only agrees here (its data goes through NCCL): one step, no data.
  const CallShape shape = call.on_gpu ? CallShape{} : shape_of(call, n);
  const std::size_t per_step = b.capacity / es / (shape.rooted ? 1 : static_cast<std::size_t>(n));
  if (per_step == 0) {
    throw UsageError(fmt::format("{}: the node buffer of {} bytes (NODAL_NODE_BUFFER_BYTES) holds less than one element per "
                                 "rank of {}",
                                 coll_kind_name(call.kind), b.capacity, n));
  }
  comm.last_algorithm.store("across_nodes", std::memory_order_relaxed);
  Waiting waiting{&comm, &call, number, 0};
  BlockingCall blocking(&describe_waiting, &waiting);
  BridgeRank& mine = b.ranks()[g - b.first_rank];
  auto buffer_of = [&](std::uint64_t s) { return static_cast<std::byte*>(client.arena->at(b.buffer_offset[s % kNodeBuffers])); };
  auto all_posted = [&](std::uint64_t s) {
    for (int j = 0; j < b.local_size; ++j) {
      if (b.ranks()[j].posted.load(std::memory_order_acquire) < s) return false;
    }
    return true;
  };
  // Large steps of a reduction whose chained fold is exact are folded by the agents (node_bridge.hpp).
  const bool foldable = !call.on_gpu && folds_exactly(call.kind, call.dtype, call.op);
  bool folded_any = false;
  // Waits for step s and takes this rank's part of its result, elements [e0, e0 + e).
  auto take = [&](std::uint64_t s, std::size_t e0, std::size_t e, bool folded) {
    waiting.step = s;
    // The step now needs the agent (a process of this node) and the network: the rank yields
    // its core to them rather than spin on it (spinning with `pause` tripled a small step here).
    auto failed = [&] { return b.mismatch.load(std::memory_order_acquire) > client.failed; };
    wait_until(
        b.word, [&] { return b.done.load(std::memory_order_acquire) >= s || failed(); }, Deadline{},
        "a collective across nodes", /*yield_core=*/true);
    if (b.done.load(std::memory_order_acquire) < s) {
      // Step m failed on every node: line up at m + 1 with this node's other ranks, say so, and
      // throw; the agent then skips m + 1 (node_bridge.hpp).
      std::string message(b.message);
      const std::uint64_t m = b.mismatch.load(std::memory_order_acquire);
      client.failed = m;
      client.step = m + 1;
      if (mine.posted.load(std::memory_order_relaxed) < m + 1) mine.posted.store(m + 1, std::memory_order_release);
      mine.resynced.store(m, std::memory_order_release);
      notify(b.word);
      throw UsageError(message);
    }
    if (folded) {
      take_result(call, 1, g, buffer_of(s) + static_cast<std::size_t>(n - 1) * e * es, e0, e);  // the result, whole
    } else if (!call.on_gpu) {
      take_result(call, n, g, buffer_of(s), e0, e);
    }
  };
  // Pipelined (nodal/detail/node_bridge.hpp): post step s, then take step s - 1's result.
  struct Posted {
    std::size_t e0, e;  // elements
    bool folded;
  };
  std::optional<Posted> previous;  // the last posted step
  std::size_t e0 = 0;
  do {
    const std::size_t e = std::min(per_step, shape.total - e0);
    const std::uint64_t s = ++client.step;
    waiting.step = s;
    // Its buffer's last user was step s - 3: free once every rank of this node posted s - 1.
    wait_until(b.word, [&] { return all_posted(s - 1); }, Deadline{}, "a collective across nodes");
    std::byte* buf = buffer_of(s);
    const std::size_t step_bytes = e * es;
    if (!shape.rooted) {
      copy_bytes(buf + static_cast<std::size_t>(g) * step_bytes, bytes(call.input) + e0 * es, step_bytes);
    } else if (g == call.root) {
      copy_bytes(buf, bytes(call.input) + e0 * es, step_bytes);
    }
    const bool folded = foldable && step_bytes >= b.fold_min_bytes;
    folded_any = folded_any || folded;
    mine.steps[s % 2] = describe_step(call, wire, number, step_bytes);
    if (folded) mine.steps[s % 2].shape = static_cast<std::uint8_t>(StepShape::folded);
    mine.float_mode[s % 2] = float_mode();
    mine.posted.store(s, std::memory_order_release);
    notify(b.word);
    if (previous) take(s - 1, previous->e0, previous->e, previous->folded);
    previous = Posted{e0, e, folded};
    e0 += e;
  } while (e0 < shape.total);
  take(client.step, previous->e0, previous->e, previous->folded);
  if (folded_any) comm.last_algorithm.store("folded_across_nodes", std::memory_order_relaxed);
}

/// A v-variant across nodes, as two fixed-size exchanges: first every rank's counts (each rank's
/// row: its own count, dtype, op, then its counts and recv_counts tables), checked on every rank
/// as on one node; then the data, each block padded to the largest count of the call (the
/// blocks' bytes beyond a count are zeros and dropped). Reductions fold in rank order: the one-node
/// bits. Not tuned: padding moves max(count) x world_size elements per rank.
void run_vector(CommState& comm, const CollCall& call) {
  const int n = comm.size;
  const int g = comm.rank;
  const auto un = static_cast<std::size_t>(n);
  const std::size_t row = 3 + 2 * un;
  std::vector<std::uint64_t> mine(row, 0), rows(row * un);
  mine[0] = call.count;
  mine[1] = static_cast<std::uint64_t>(call.dtype);
  mine[2] = static_cast<std::uint64_t>(call.op);
  for (std::size_t j = 0; j < un; ++j) {
    if (call.counts) mine[3 + j] = call.counts[j];
    if (call.recv_counts) mine[3 + un + j] = call.recv_counts[j];
  }
  exchange(comm, CollCall{CollKind::allgather, mine.data(), rows.data(), row, DType::i64, ReduceOp::sum, call.root},
           call.kind);
  auto row_of = [&](int j) { return rows.data() + static_cast<std::size_t>(j) * row; };
  auto dtype_op = [&](int j) {
    return fmt::format("{} ({})", dtype_name(static_cast<DType>(row_of(j)[1])),
                       reduce_op_name(static_cast<ReduceOp>(row_of(j)[2])));
  };
  for (int j = 1; j < n; ++j) {
    if (row_of(j)[1] != row_of(0)[1] || row_of(j)[2] != row_of(0)[2]) {
      throw UsageError(fmt::format("{} on communicator '{}': rank {} passes {} but rank 0 passes {}",
                                   coll_kind_name(call.kind), comm.name, j, dtype_op(j), dtype_op(0)));
    }
  }
  check_vector_counts(comm, call, [&](int j) { return VectorCounts{row_of(j)[0], row_of(j) + 3, row_of(j) + 3 + un}; });

  // The table every rank reads its blocks' sizes from: send counts of rank p to rank q.
  const std::size_t es = element_size(call.dtype);
  const int source = call.kind == CollKind::gatherv || call.kind == CollKind::scatterv ? call.root : g;
  const std::uint64_t* counts = row_of(source) + 3;  // agreed by every rank (checked above)
  std::size_t largest = 0;
  for (int p = 0; p < n; ++p) {
    for (std::size_t q = 0; q < un; ++q) {
      if (call.kind == CollKind::alltoallv || p == source) largest = std::max<std::size_t>(largest, row_of(p)[3 + q]);
    }
  }
  if (largest == 0) return;
  const std::size_t block = largest * es;
  // Packs `from` (blocks of sizes[q] elements back to back) into `to` (blocks of `largest`).
  auto pack = [&](std::vector<std::byte>& to, const std::uint64_t* sizes) {
    to.assign(un * block, std::byte{0});
    std::size_t at = 0;
    for (std::size_t q = 0; q < un; ++q) {
      copy_bytes(to.data() + q * block, bytes(call.input) + at * es, sizes[q] * es);
      at += sizes[q];
    }
  };
  // Unpacks `from` (blocks of `largest`) into the output (blocks of sizes[p] back to back).
  auto unpack = [&](const std::vector<std::byte>& from, const std::uint64_t* sizes) {
    std::size_t at = 0;
    for (std::size_t p = 0; p < un; ++p) {
      copy_bytes(static_cast<std::byte*>(call.output) + at * es, from.data() + p * block, sizes[p] * es);
      at += sizes[p];
    }
  };
  std::vector<std::byte> in, out;
  CollCall fixed{CollKind::allgather, nullptr, nullptr, largest, call.dtype, call.op, call.root};
  switch (call.kind) {
    case CollKind::allgatherv:
    case CollKind::gatherv:
      in.assign(block, std::byte{0});
      copy_bytes(in.data(), call.input, call.count * es);
      if (call.kind == CollKind::allgatherv || g == call.root) out.resize(un * block);
      fixed.kind = call.kind == CollKind::allgatherv ? CollKind::allgather : CollKind::gather;
      fixed.input = in.data();
      fixed.output = out.data();
      exchange(comm, fixed, call.kind);
      if (call.kind == CollKind::allgatherv || g == call.root) unpack(out, counts);
      return;
    case CollKind::scatterv:
      if (g == call.root) pack(in, counts);
      out.resize(block);
      fixed.kind = CollKind::scatter;
      fixed.input = in.data();
      fixed.output = out.data();
      exchange(comm, fixed, call.kind);
      copy_bytes(call.output, out.data(), counts[g] * es);
      return;
    case CollKind::alltoallv:
    case CollKind::reduce_scatterv: {
      pack(in, counts);
      const bool all = call.kind == CollKind::alltoallv;
      out.resize(all ? un * block : block);
      fixed.kind = all ? CollKind::alltoall : CollKind::reduce_scatter;
      fixed.input = in.data();
      fixed.output = out.data();
      exchange(comm, fixed, call.kind);
      if (all) {
        unpack(out, row_of(g) + 3 + un);  // my recv_counts
      } else {
        copy_bytes(call.output, out.data(), counts[g] * es);
      }
      return;
    }
    default: return;
  }
}

}  // namespace

void run_across_nodes(CommState& comm, const CollCall& call) {
  check_job_alive();
  if (is_vector(call.kind)) {
    run_vector(comm, call);
  } else {
    exchange(comm, call, call.kind);
  }
}

}  // namespace nodal::detail
