// Which shared-memory algorithm a call takes: the one table, by message size and where the
// buffers are, that NODAL_ALGO / NODAL_ALLREDUCE_ALGO override (Communicator::algorithm_table()
// prints it). Internal. The algorithms, each in the file named for it:
//
//   small      shm/small.cpp          the data rides in the call slots with the headers
//                                     (<= 16 KiB of slot data per rank; broadcast, scatter, reduce further
//                                     where ranks outnumber cores: small_max_bytes); for broadcast,
//                                     scatter, gather and reduce one-directional: the sender
//                                     posts and returns (shm/call.hpp "Rooted small calls")
//   in_place   shm/pipelined_*.cpp    every buffer a peer reads is in the arena: read it there
//              shm/push_allreduce.cpp allreduce's: each block's owner reduces it and writes it
//                                     into every output (one pass: a copy's traffic)
//   cma        shm/cma.cpp            private buffers of the copy collectives (below 1 MiB,
//                                     broadcast 2 MiB, allgather, gather, alltoall 512 KiB, unless
//                                     ranks outnumber cores), reduce (while every rank has
//                                     a core) and (2 ranks, 1-32 MiB, in place 1-64 MiB) allreduce,
//                                     >= NODAL_CMA_MIN_BYTES per rank: one process_vm_readv
//                                     per peer (Open MPI's and MPICH's single-copy path);
//                                     gather's peers instead write into the root's output, and
//                                     allreduce in place from 8 MiB, with process_vm_writev
//   linear     shm/linear_reduce.cpp  reduce of private buffers where cma does not take it, on 2
//                                     ranks (each with a core) up to 8 MiB, and where ranks
//                                     outnumber cores while the root's share is small: the peers
//                                     stage their inputs segment by segment, the root folds them
//                                     as they come
//   pipelined  shm/pipelined_*.cpp    staged through a ring of chunks in the arena
//   staged     shm/vector_collectives.cpp  the v-variants
#pragma once

#include "comm_state.hpp"

#include <nodal/communicator.hpp>

#include <cstddef>
#include <vector>

namespace nodal::detail {

enum class Algorithm { small, pipelined, in_place, cma, linear };

/// "small", "pipelined", "in_place", "cma", "linear" (what Communicator::last_algorithm() reports).
const char* algorithm_name(Algorithm algorithm) noexcept;

/// Whether a small call of `kind` is one-directional (broadcast, scatter, gather, reduce: its
/// senders post and return; shm/call.hpp "Rooted small calls"). Inline: every call asks.
inline bool is_rooted(CollKind kind) noexcept {
  return kind == CollKind::broadcast || kind == CollKind::scatter || kind == CollKind::gather ||
         kind == CollKind::reduce;
}

/// Whether `kind` combines values (allreduce, reduce, reduce_scatter, reduce_scatterv).
inline bool is_reduction(CollKind kind) noexcept {
  return kind == CollKind::allreduce || kind == CollKind::reduce || kind == CollKind::reduce_scatter ||
         kind == CollKind::reduce_scatterv;
}

/// How far a call of `kind` takes the small path: the largest per-rank slot contribution
/// (shm/call.hpp contribution_bytes: a scatter root's, but on 2 ranks, and every alltoall and
/// reduce_scatter rank's is world_size messages) on a communicator of `world_size` members, `crowded` when
/// ranks outnumber cores (SharedComm::crowded). NODAL_SMALL_MAX_BYTES, where set, for every op;
/// else kSmallMaxBytes, except where ranks outnumber cores: on 2-4 ranks broadcast and scatter
/// take it up to 64 KiB (kSmallSlotMaxBytes), on 4 ranks reduce up to 32 KiB. There a lockstep call
/// beyond the small path waits for every rank to be scheduled, while a small rooted call's sender
/// posts and returns. 4 ranks on 2 cores, private buffers, against 16 KiB for every op (three
/// runs): broadcast 2.5-5x the speed at 32-64 KiB, scatter 2.1-3.8x at 8-16 KiB, reduce 1.5-2.0x at
/// 32 KiB; 3 ranks broadcast and scatter alike, reduce 0.72-2x (so not there); arena buffers
/// broadcast and scatter 1.0-3.8x, reduce 1.5-1.9x (bench/results/2026-12-02-crowded-rooted-small.md,
/// which also says why allreduce and reduce_scatter on 2 ranks, allgather and alltoall crowded,
/// faster on the small path with private buffers, do not take it: 2-3x slower than in_place with
/// arena buffers, and whether a call is small must not depend on where one rank's buffers are).
std::size_t small_max_bytes(CollKind kind, int world_size, bool crowded, const CommConfig& config) noexcept;

/// Whether a call takes the small path: not on cuda tensors, its largest per-rank slot contribution
/// (`largest_bytes`) within small_max_bytes, and no override forbids it. Throws UsageError for a
/// malformed override.
bool takes_small(CollKind kind, bool on_gpu, std::size_t largest_bytes, int world_size, bool crowded,
                 const CommConfig& config);

/// The algorithm of a call that does not take the small path, once every header is known:
/// `bytes` per rank, `all_in_arena` (every buffer a peer reads is in the arena), `cma_usable` (every rank whose
/// input a peer reads allows cross-memory attach, and the message is >= CommConfig::cma_min_bytes).
/// `in_place`: every rank's input and output are one buffer (from the headers, so every rank
/// picks the same). `crowded`: the node runs more ranks than cores (SharedComm::crowded).
Algorithm large_algorithm(CollKind kind, std::size_t bytes, int world_size, bool in_place, bool all_in_arena,
                          bool cma_usable, bool crowded);

/// scatter, whose root alone produces, takes cma below this size (bytes per rank) unless ranks
/// outnumber cores: with a core per rank the pipelined path, where the producer stages a chunk
/// while its consumers copy out the previous one, uses both cores and was 1.1-4.2x faster from
/// 1 MiB on 2 ranks (broadcast 2.9-4.2x from 2 MiB; scatter 0.84-0.89x at 32-64 MiB the
/// exception), cma 1.1-2x faster at 64-512 KiB; with 4 ranks on 2 cores cma won at nearly every
/// size, up to 6x (bench/results/2026-11-27-cma-copy-limit.md). Measured again on AMD EPYC on
/// 2026-12-08 with scatter on cma at every size: 0.69-0.80x at 2-64 MiB
/// (bench/results/2026-12-08-cma-broadcast-end-epyc.md).
constexpr std::size_t kCmaCopyEndBytes = 1024 * 1024;

/// broadcast's end instead, since its root writes a share of the message into the receivers while
/// they read the rest (shm/cma.cpp run_cma_broadcast): on 2 ranks of an AMD EPYC the split cma
/// was 1.49-1.61x the pipelined path's speed at 1 MiB (42 us against 64-67), even at 2-16 MiB
/// (0.93-1.10x) and behind at 32-64 MiB (0.77-0.88x)
/// (bench/results/2026-12-08-cma-broadcast-end-epyc.md).
constexpr std::size_t kCmaBroadcastEndBytes = 2u << 20;

/// allgather, gather and alltoall, where every rank produces, take cma below this size instead:
/// at 512 KiB on 2 ranks their pipelined path in two steps was 1.2-1.9x cma's speed (gather
/// 28 us against 54), at 256 KiB 0.4-0.9x (bench/results/2026-11-28-two-step-pipeline.md);
/// gather with its peers writing (shm/cma.cpp run_cma_gather) was still 1.12-2.16x slower than
/// the pipelined path at 512 KiB-64 MiB (bench/results/2026-11-29-gather-peers-write.md).
constexpr std::size_t kCmaCopyAllProduceEndBytes = 512 * 1024;

/// The ends above were measured on AMD EPYC. On Intel Xeon (2 cores, 2 MiB of L2 each) cma was
/// 1.13-3.8x the pipelined path's speed on 2 ranks from 512 KiB: allgather and alltoall to 8 MiB
/// (0.72-0.96x from 16 MiB, where the pipelined path streams its stores), broadcast to 4 MiB (0.95x
/// at 8 MiB), gather and scatter to 64 MiB (bench/results/2026-12-02-cma-copy-on-xeon.md). So on
/// an Intel processor the end of allgather and alltoall holds instead; gather and scatter take
/// cma at every size, and so does broadcast since its root writes a share of the message into the
/// receivers while they read the rest (shm/cma.cpp run_cma_broadcast): 1.7-1.8x the pipelined
/// path's speed at 8-32 MiB on 2 ranks, even at 64 MiB (bench/results/2026-12-02-split-broadcast.md).
constexpr std::size_t kXeonCmaAllProduceEndBytes = 16u << 20;

/// Below which size (bytes per rank) a copy collective of `kind` takes cma while every rank has
/// a core: kCmaBroadcastEndBytes, kCmaCopyEndBytes or kCmaCopyAllProduceEndBytes, or on an Intel
/// processor the Xeon ends (SIZE_MAX: no end). The same on every rank of a node (one processor).
std::size_t cma_copy_end_bytes(CollKind kind) noexcept;

/// reduce takes cma (while every rank has a core) or linear (when ranks outnumber cores), its root
/// folding every peer's input alone, while (world_size - 1) * bytes per rank stays within this
/// (on 2 ranks with a core each, linear goes on to kLinearReduceMaxBytes).
constexpr std::size_t kCmaReduceMaxBytes = 256 * 1024;

/// reduce of private buffers on 2 ranks, each with a core, takes the linear path
/// (shm/linear_reduce.cpp) up to this size (bytes per rank) where cma does not take it: the root's
/// one fold per byte, overlapped with the peer's staging, against the pipelined path's staging
/// copy, fold and gather copy. 1.06-1.9x the pipelined path at 512 KiB-8 MiB, 0.87-0.95x from
/// 16 MiB (bench/results/2026-11-28-linear-reduce.md).
constexpr std::size_t kLinearReduceMaxBytes = 8 * 1024 * 1024;

/// allreduce of private buffers takes cma (reduce-scatter and all-gather by process_vm_readv, one
/// block per rank, 8 MiB segments) on 2 ranks from kCmaAllreduceMinBytes per rank, up to
/// kCmaAllreduceInPlaceMaxBytes in place (input == output, as torch's and MPI_IN_PLACE calls are)
/// and below kCmaAllreduceEndBytes otherwise: in place 1.7x the pipelined path at 16 MiB, 1.7x at
/// 32 MiB, 1.1x at 64 MiB; out of place 1.5x at 16 MiB, even at 32 MiB, 0.75-0.9x beyond
/// (bench/results/2026-11-26-cma-allreduce.md); 0.8x on 4 ranks sharing 2 cores.
constexpr std::size_t kCmaAllreduceMinBytes = 1024 * 1024;
constexpr std::size_t kCmaAllreduceEndBytes = 32 * 1024 * 1024;
constexpr std::size_t kCmaAllreduceInPlaceMaxBytes = 64 * 1024 * 1024;

/// The table as Communicator::algorithm_table() returns it.
std::vector<AlgorithmRule> describe_algorithm_table(const CommConfig& config);

}  // namespace nodal::detail
