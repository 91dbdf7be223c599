// Communicators of part of a job that spans nodes (split or create_group of the world, whose
// members are not all on one node). The node bridge's steps involve every rank of every node, so
// these calls run over send/recv instead (any two ranks: nodal/detail/p2p_channel.hpp, between
// nodes moved by the agents): the members first pass their calls' descriptions around a ring and
// compare them (a mismatch is the same UsageError on every member, and the communicator goes on),
// then every contribution around the ring (the root's alone along it for broadcast and scatter),
// and each member computes its result from all of them as the world's calls across nodes do
// (take_result: reductions fold in rank order, so the bits are the one-node bits), in segments of
// bounded memory. Untuned: each member receives every contribution, and each ring step is a
// rendezvous. Each such communicator keeps its ring's channels (about 0.5 MiB each, in both
// nodes' arenas when the pair crosses nodes) for the job's life.
#include "internode/across_nodes.hpp"

#include "copy.hpp"
#include "shm/algorithm_table.hpp"

#include <nodal/detail/node_bridge.hpp>
#include <nodal/errors.hpp>

#include <algorithm>
#include <cstring>
#include <string>

#include <fmt/format.h>

namespace nodal::detail {
namespace {

/// Every member's `block` bytes gathered in ring order: position p's at all + p * block (this
/// member's is there already). Even positions send first, odd ones receive first: with send a
/// rendezvous, the chain that starts at position 0 unblocks the rest.
void ring_allgather(CommState& ring, std::byte* all, std::size_t block, int tag) {
  const int n = ring.size;
  const int p = ring.rank;
  const int next = (p + 1) % n;
  const int prev = (p + n - 1) % n;
  for (int s = 0; s < n - 1; ++s) {
    const auto out = static_cast<std::size_t>((p - s + n) % n);
    const auto in = static_cast<std::size_t>((p - s - 1 + 2 * n) % n);
    auto send = [&] { send_message(ring, all + out * block, block, DType::u8, next, tag); };
    auto recv = [&] { recv_message(ring, all + in * block, block, DType::u8, prev, tag); };
    if (p % 2 == 0) {
      send();
      recv();
    } else {
      recv();
      send();
    }
  }
}

/// `bytes` at `data` from ring position `root` to every member, along the ring.
void ring_broadcast(CommState& ring, std::byte* data, std::size_t bytes, int root, int tag) {
  const int n = ring.size;
  const int distance = (ring.rank - root + n) % n;
  if (distance != 0) recv_message(ring, data, bytes, DType::u8, (ring.rank + n - 1) % n, tag);
  if (distance != n - 1) send_message(ring, data, bytes, DType::u8, (ring.rank + 1) % n, tag);
}

/// The ring position of each rank of `comm` (ring: the members in order of global rank).
std::vector<int> ring_positions(const CommState& comm) {
  const CommState& ring = *comm.across_nodes->ring;
  std::vector<int> positions(static_cast<std::size_t>(comm.size));
  for (int j = 0; j < comm.size; ++j) {
    const auto at = std::find(ring.global_ranks.begin(), ring.global_ranks.end(), comm.global_ranks[static_cast<std::size_t>(j)]);
    positions[static_cast<std::size_t>(j)] = static_cast<int>(at - ring.global_ranks.begin());
  }
  return positions;
}

/// The description with its reduce op's name (the agents' messages, which cannot name it, omit it).
std::string describe(const BridgeStep& s) {
  const auto op = static_cast<ReduceOp>(s.op & ~BridgeStep::kOnGpu);
  return describe_bridge_step(s, is_reduction(static_cast<CollKind>(s.kind)) ? reduce_op_name(op) : std::string_view{});
}

}  // namespace

std::shared_ptr<CommState> open_group_across_nodes(const CommState& parent, std::string name, int rank,
                                                   std::vector<int> global_ranks, bool check_order) {
  auto make = [&](std::string state_name, int state_rank, std::vector<int> members) {
    auto state = std::make_shared<CommState>();
    state->arena = parent.arena;
    state->name = std::move(state_name);
    state->rank = state_rank;
    state->size = static_cast<int>(members.size());
    state->global_ranks = std::move(members);
    state->config = comm_config();
    auto client = std::make_shared<BridgeClient>();
    client->arena = parent.arena;
    client->bridge = parent.across_nodes->bridge;
    state->across_nodes = std::move(client);
    // Only its wake word is used (send/recv between members on this node).
    state->shared = static_cast<SharedComm*>(parent.arena->find_or_create(
        ("nodal.comm-across:" + state->name).c_str(), sizeof(SharedComm), kCacheLine,
        [](void* where) { new (where) SharedComm{}; }));
    return state;
  };
  std::vector<int> sorted = global_ranks;
  std::sort(sorted.begin(), sorted.end());
  const int mine = global_ranks[static_cast<std::size_t>(rank)];
  const int position = static_cast<int>(std::find(sorted.begin(), sorted.end(), mine) - sorted.begin());
  auto state = make(name, rank, global_ranks);
  state->across_nodes->ring = make(name + "#ring", position, sorted);
  if (check_order) {
    // The lists' hashes around the ring (the same for every member, whatever its order).
    CommState& ring = *state->across_nodes->ring;
    std::vector<std::uint64_t> hashes(sorted.size());
    hashes[static_cast<std::size_t>(position)] = members_hash(global_ranks);
    ring_allgather(ring, reinterpret_cast<std::byte*>(hashes.data()), sizeof(std::uint64_t), 0);
    if (hashes[static_cast<std::size_t>(position)] != hashes[0]) {
      throw UsageError(fmt::format("communicator {}: its members list its ranks in different orders (every member "
                                   "must pass the same ranks in the same order)",
                                   name));
    }
  }
  return state;
}

void exchange_in_group(CommState& comm, const CollCall& call, CollKind wire) {
  CommState& ring = *comm.across_nodes->ring;
  const int n = comm.size;
  const std::uint64_t number = ++comm.seq;
  const int tag = static_cast<int>(number & 0x7fffffff);
  comm.last_algorithm.store("across_nodes_ring", std::memory_order_relaxed);
  const std::vector<int> positions = ring_positions(comm);
  const std::size_t es = element_size(call.dtype);
  const CallShape shape = shape_of(call, n);
  // A call on cuda tensors only agrees here (its data goes through NCCL).
  const std::size_t bytes = call.on_gpu ? 0 : shape.total * es;

  // 1. The descriptions, compared on every member: a mismatch is found before any data moves.
  std::vector<BridgeStep> steps(static_cast<std::size_t>(n));
  steps[static_cast<std::size_t>(ring.rank)] = describe_step(call, wire, number, bytes);
  ring_allgather(ring, reinterpret_cast<std::byte*>(steps.data()), sizeof(BridgeStep), tag);
  for (int p = 1; p < n; ++p) {
    if (!(steps[static_cast<std::size_t>(p)] == steps[0])) {
      throw UsageError(fmt::format("communicator '{}': ranks {} and {} made different calls: {} and {}", comm.name,
                                   ring.global_ranks[0], ring.global_ranks[static_cast<std::size_t>(p)],
                                   describe(steps[0]), describe(steps[static_cast<std::size_t>(p)])));
    }
  }
  if (bytes == 0) return;  // barrier, or calls of no elements: the descriptions were the meeting

  // 2. The data, in segments: a member holds every contribution to one segment, at most the node
  // buffer's size (NODAL_NODE_BUFFER_BYTES, as a step of the world's calls; or one element per
  // member) at a time.
  const std::size_t budget = comm.across_nodes->bridge->capacity;
  const std::size_t per_segment = std::max<std::size_t>(1, budget / es / (shape.rooted ? 1 : static_cast<std::size_t>(n)));
  const bool in_rank_order = std::is_sorted(comm.global_ranks.begin(), comm.global_ranks.end());
  std::vector<std::byte> gathered, by_rank;
  for (std::size_t e0 = 0; e0 < shape.total; e0 += per_segment) {
    const std::size_t e = std::min(per_segment, shape.total - e0);
    const std::size_t segment = e * es;
    const auto* input = static_cast<const std::byte*>(call.input) + e0 * es;
    if (shape.rooted) {
      gathered.resize(segment);
      if (comm.rank == call.root) copy_bytes(gathered.data(), input, segment);
      ring_broadcast(ring, gathered.data(), segment, positions[static_cast<std::size_t>(call.root)], tag);
      take_result(call, n, comm.rank, gathered.data(), e0, e);
      continue;
    }
    gathered.resize(static_cast<std::size_t>(n) * segment);
    copy_bytes(gathered.data() + static_cast<std::size_t>(ring.rank) * segment, input, segment);
    ring_allgather(ring, gathered.data(), segment, tag);
    if (in_rank_order) {
      take_result(call, n, comm.rank, gathered.data(), e0, e);
      continue;
    }
    // Contributions in ring order -> in the communicator's rank order (members listed out of
    // global order).
    by_rank.resize(gathered.size());
    for (int j = 0; j < n; ++j) {
      copy_bytes(by_rank.data() + static_cast<std::size_t>(j) * segment,
                 gathered.data() + static_cast<std::size_t>(positions[static_cast<std::size_t>(j)]) * segment, segment);
    }
    take_result(call, n, comm.rank, by_rank.data(), e0, e);
  }
}

}  // namespace nodal::detail
