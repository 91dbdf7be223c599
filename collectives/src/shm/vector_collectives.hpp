// The v-variants on the shared-memory path: allgatherv, gatherv, scatterv, alltoallv (torch's
// all_to_all_single with split sizes) and reduce_scatterv (MPI_Reduce_scatter's unequal counts).
// Internal.
//
// Each rank copies its counts and its data into its own staging area in the arena (one per call
// parity, grown on demand), publishes the area's offset in its call header, and after the header
// exchange every rank reads the peers' counts, checks that they agree, and copies (or reduces)
// what it receives straight out of the peers' areas. Two copies per byte (the fixed-size calls
// read peers' buffers in place or by cross-memory attach: one), and no per-size tuning yet.
// Reusing an area is safe by credits (shm/call.hpp): the area of parity k % 2 was last read in
// call k - 2, and a rank stages call k once every peer has finished call k - 2.
#pragma once

#include "shm/algorithms.hpp"

#include <cstdint>
#include <functional>

namespace nodal::detail {

/// Whether `kind` is a v-variant (allgatherv, gatherv, scatterv, alltoallv, reduce_scatterv).
/// Inline: every call asks.
inline bool is_vector(CollKind kind) noexcept {
  return kind == CollKind::allgatherv || kind == CollKind::gatherv || kind == CollKind::scatterv ||
         kind == CollKind::alltoallv || kind == CollKind::reduce_scatterv;
}

/// Rank j's counts of a v-variant call as the checks read them: its own count (the public call's
/// `count`; its receive total for reduce_scatterv), and its counts and recv_counts tables (world_size
/// entries each, zeros where the call gives none).
struct VectorCounts {
  std::uint64_t own;
  const std::uint64_t* counts;
  const std::uint64_t* recv_counts;
};

/// Checks every rank's counts of `call` against each other, reading them only through
/// `counts_of(j)` in the same order on every rank: the same UsageError on every rank when they
/// disagree. (The shared-memory path reads them from the peers' staging areas, the path across
/// nodes from an exchange: internode/across_nodes.cpp.)
void check_vector_counts(const CommState& comm, const CollCall& call, const std::function<VectorCounts(int)>& counts_of);

/// Before this rank's header of call `seq`: copies its counts and data into its staging area;
/// returns the area's arena offset. Throws ShmError when the arena has no room.
std::uint64_t stage_vector_call(CommState& comm, const CollCall& call, std::uint64_t seq);

/// After every member's header of call `seq`: checks the counts of every rank against each other
/// (the same UsageError on every rank when they disagree) and moves the data.
void finish_vector_call(CommState& comm, const CollCall& call, std::uint64_t seq);

}  // namespace nodal::detail
