// Pipelined copies (broadcast, allgather, gather, scatter, alltoall beyond the small path): each
// producer's data reaches its consumers in one of three ways. in_place: the producers' buffers are
// in the arena, consumers copy straight out of them; cma: consumers read private buffers with one
// process_vm_readv each (shm/cma.cpp; gather's cma is run_cma_gather there); pipelined: producers
// stage slices through their ring entries and consumers copy them out, step by step.
#include "shm/call.hpp"

#include "copy.hpp"

#include <algorithm>
#include <chrono>

namespace nodal::detail {

void Call::run_pipelined_copy(Algorithm algorithm) {
  // in_place: peers' inputs are in the arena, read them there; cma: read them where they are
  // with process_vm_readv, in one step; pipelined: stage them through the ring.
  const bool in_place = algorithm == Algorithm::in_place;
  const bool cma = algorithm == Algorithm::cma;
  const bool direct = in_place || cma;
  const CollKind kind = call_.kind;
  const bool rooted_producer = kind == CollKind::broadcast || kind == CollKind::scatter;
  const bool per_consumer = kind == CollKind::scatter || kind == CollKind::alltoall;
  auto producer = [&](int j) { return !rooted_producer || j == call_.root; };
  // scatter's root copies its own block out too.
  auto consumer = [&](int j) { return reads_from_peers(j) || (kind == CollKind::scatter && j == call_.root); };
  // Where in producer p's ring entry consumer q's slice goes. scatter's root stages a slice for
  // every other rank, its own block never (2 ranks: whole-entry slices, 1.07-1.2x at 1-4 MiB);
  // alltoall keeps a slot per rank, its own unused: its half-entry slices beat whole ones on
  // 2 ranks at 2-8 MiB (whole ones 0.65-0.85x; bench/results/2026-11-28-two-step-pipeline.md).
  const bool skip_own_slot = kind == CollKind::scatter;
  const std::size_t slots = !per_consumer ? 1 : static_cast<std::size_t>(skip_own_slot ? std::max(n_ - 1, 1) : n_);
  auto slot_of = [&](int p, int q) -> std::size_t {
    if (!per_consumer) return 0;
    return static_cast<std::size_t>(skip_own_slot && q > p ? q - 1 : q);
  };
  const std::size_t per_step = cma ? call_.count : in_place ? block_elements(slots) : pipeline_step(block_elements(slots));
  const std::size_t steps = ceil_div(call_.count, per_step);
  // Element offsets: of the block producer p sends to consumer q in p's input, and of what q
  // receives from p in q's output.
  auto in_block = [&](int q) -> std::size_t { return per_consumer ? q * call_.count : 0; };
  auto out_block = [&](int p) -> std::size_t { return rooted_producer ? 0 : p * call_.count; };
  const std::size_t esize = esize_;
  const bool stream = call_.count * esize >= kStreamMinBytes;
  // My own block needs no staging.
  if (producer(r_) && consumer(r_)) {
    copy_bytes(bytes(call_.output) + out_block(r_) * esize, bytes(call_.input) + in_block(r_) * esize, call_.count * esize);
  }
  bool i_produce = false;
  for (int q = 0; q < n_; ++q) i_produce = i_produce || (producer(r_) && q != r_ && consumer(q));
  // Staging: with the stores each reader asked for in its header (its choice per call,
  // shm/staging_stores.hpp). A slice from p that every other reader reads (broadcast, allgather;
  // gather's one reader is the root) is streamed if any of them asked for it; one for q alone
  // (scatter, alltoall) as q asked.
  const bool stages = i_produce && !direct;
  auto wants_streaming = [&](int q) { return c_.header(q, seq_).staging == static_cast<std::uint8_t>(StagingMode::streaming); };
  // Readers that asked for streaming, counted once: a shared slice from p is streamed if any
  // reader but p did (O(1) per slice, not a pass over every header for each of n producers).
  int asking = 0;
  for (int j = 0; !direct && !per_consumer && j < n_; ++j) asking += reads_from_peers(j) && wants_streaming(j);
  auto streamed = [&](int p, int q) {  // the slice producer p stages for reader q
    if (per_consumer) return wants_streaming(q);
    return asking - (reads_from_peers(p) && wants_streaming(p) ? 1 : 0) > 0;
  };
  // A reader times the call from here to its end (its copies out of the slices are what the
  // stores change) where every slice it reads came with the same stores, and records it under those.
  int read_in = -1;  // the mode every slice this rank reads came in; -1: none yet, 2: mixed
  for (int p = 0; reads_from_peers(r_) && !direct && p < n_; ++p) {
    if (p == r_ || !producer(p)) continue;
    const int mode = streamed(p, r_) ? 1 : 0;
    read_in = read_in < 0 || read_in == mode ? mode : 2;
  }
  const bool timed = (read_in == 0 || read_in == 1) && StagingStores::adaptive(call_.count * esize);
  const auto began = timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  for (std::size_t i = 0; i < steps; ++i) {
    const std::size_t begin = i * per_step;
    const std::size_t len = std::min(per_step, call_.count - begin);
    if (stages) {
      if (i >= static_cast<std::size_t>(c_.config.ring_depth)) {
        for (int q = 0; q < n_; ++q) {
          if (q != r_ && consumer(q)) wait_consumed(q, i - c_.config.ring_depth);
        }
      }
      for (int q = 0; q < (per_consumer ? n_ : 1); ++q) {
        if (per_consumer && (q == r_ || !consumer(q))) continue;
        copy_bytes(c_.stage(r_, i) + slot_of(r_, q) * per_step * esize, bytes(call_.input) + (in_block(q) + begin) * esize,
                   len * esize, streamed(r_, q));
      }
      publish(c_, progress(r_).posted, flag(i));
    }
    if (consumer(r_)) {
      for (int p = 0; p < n_; ++p) {
        if (p == r_ || !producer(p)) continue;
        std::byte* to = bytes(call_.output) + (out_block(p) + begin) * esize;
        if (cma) {
          cma_read(p, to, c_.header(p, seq_).input_offset + (in_block(r_) + begin) * esize, len * esize);
          continue;
        }
        const std::byte* from;
        if (in_place) {
          from = bytes(peer_input(p)) + (in_block(r_) + begin) * esize;
        } else {
          wait_flag(c_, progress(p).posted, flag(i), "collective");
          from = c_.stage(p, i) + slot_of(p, r_) * per_step * esize;
        }
        copy_bytes(to, from, len * esize, stream);
      }
      publish(c_, progress(r_).consumed, flag(i));
    }
  }
  if (direct && i_produce && steps > 0) {
    for (int q = 0; q < n_; ++q) {
      if (q != r_ && consumer(q)) wait_consumed(q, steps - 1);
    }
  }
  if (timed) {
    const auto took = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - began);
    c_.staging_stores.record(kind, call_.count * esize, static_cast<StagingMode>(read_in),
                             static_cast<StagingMode>(c_.header(r_, seq_).staging), static_cast<std::uint64_t>(took.count()));
  }
}

}  // namespace nodal::detail
