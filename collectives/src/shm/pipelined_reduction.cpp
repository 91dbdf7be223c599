// Pipelined reductions (allreduce, reduce, reduce_scatter beyond the small path): reduce-scatter,
// plus all-gather for allreduce and a gather to the root for reduce, in steps of at most one ring
// entry.
// Each rank reduces one block per step: from the peers' staged copies in the ring (pipelined) or
// straight from their arena buffers (in_place: reduce and reduce_scatter; allreduce's in_place is
// shm/push_allreduce.cpp); ring entries are reused once every reader has published `consumed` for
// the step that used them.
#include "shm/call.hpp"

#include "copy.hpp"
#include "reduce_kernels.hpp"

#include <algorithm>
#include <cstring>

namespace nodal::detail {
namespace {

/// Block b of step i: where it is in the input and output (elements) and in a ring entry (bytes).
struct Piece {
  std::size_t in;
  std::size_t out;
  std::size_t len;
  std::size_t ring;
};

}  // namespace

void Call::run_pipelined_reduction(bool in_place) {
  const std::size_t per_block = block_elements(static_cast<std::size_t>(n_));
  const std::size_t line = kCacheLine / esize_;
  const bool scatter = call_.kind == CollKind::reduce_scatter;
  // A ring entry holds per_block elements of each block; a staged step may take less
  // (pipeline_step). In place, the peers' buffers are read where they are: nothing to overlap.
  const std::size_t most = scatter ? per_block : per_block * n_;
  const std::size_t step_elements = in_place ? most : pipeline_step(most);
  const std::size_t steps = ceil_div(call_.count, step_elements);
  auto piece = [&](std::size_t i, int b) -> Piece {
    if (scatter) {
      std::size_t begin = i * step_elements;
      std::size_t len = std::min(step_elements, call_.count - begin);
      return {b * call_.count + begin, begin, len, b * per_block * esize_};
    }
    std::size_t base = i * step_elements;
    std::size_t len = std::min(step_elements, call_.count - base);
    std::size_t block = std::min(per_block, ceil_div(ceil_div(len, n_), line) * line);
    std::size_t begin = std::min(len, b * block);
    std::size_t end = std::min(len, (b + 1) * block);
    return {base + begin, base + begin, end - begin, b * block * esize_};
  };
  // Who gathers the reduced blocks: everyone (allreduce), the root (reduce), nobody.
  const bool gather_all = call_.kind == CollKind::allreduce;
  const bool gathers = gather_all || (call_.kind == CollKind::reduce && r_ == call_.root);
  const bool any_gather = call_.kind != CollKind::reduce_scatter;
  // Outputs nobody reads soon (the gathered blocks, my own block) are written with streaming
  // stores when the message is large.
  const bool stream = call_.count * esize_ >= kStreamMinBytes;
  const bool uses_ring = !in_place || any_gather;
  Sources srcs(n_);
  for (std::size_t i = 0; i < steps; ++i) {
    if (uses_ring && i >= static_cast<std::size_t>(c_.config.ring_depth)) {
      for (int j = 0; j < n_; ++j) {
        if (j != r_) wait_consumed(j, i - c_.config.ring_depth);
      }
    }
    const Piece mine = piece(i, r_);
    if (!in_place) {
      for (int b = 0; b < n_; ++b) {
        if (b == r_) continue;
        Piece p = piece(i, b);
        std::memcpy(c_.stage(r_, i) + p.ring, bytes(call_.input) + p.in * esize_, p.len * esize_);
      }
      publish(c_, progress(r_).posted, flag(i));
    }
    for (int j = 0; j < n_; ++j) {
      if (j == r_) {
        srcs[j] = bytes(call_.input) + mine.in * esize_;
      } else if (in_place) {
        srcs[j] = bytes(peer_input(j)) + mine.in * esize_;
      } else {
        wait_flag(c_, progress(j).posted, flag(i), "collective");
        srcs[j] = c_.stage(j, i) + mine.ring;
      }
    }
    // Where my reduced block goes: my output when I keep it, else the result ring, copied to my
    // output if I gather.
    const bool to_output = scatter || (call_.kind == CollKind::reduce && r_ == call_.root);
    void* dst = to_output ? static_cast<void*>(bytes(call_.output) + mine.out * esize_) : c_.result(r_, i) + mine.ring;
    reduce_n(call_.dtype, call_.op, dst, srcs.data(), n_, mine.len, stream && to_output);
    if (any_gather) {
      if (!to_output && gathers) copy_bytes(bytes(call_.output) + mine.out * esize_, dst, mine.len * esize_, stream);
      publish(c_, progress(r_).reduced, flag(i));
    }
    if (gathers) {
      for (int b = 0; b < n_; ++b) {
        if (b == r_) continue;
        wait_flag(c_, progress(b).reduced, flag(i), "collective");
        Piece p = piece(i, b);
        copy_bytes(bytes(call_.output) + p.out * esize_, c_.result(b, i) + p.ring, p.len * esize_, stream);
      }
    }
    publish(c_, progress(r_).consumed, flag(i));
  }
  // Peers read my own buffers in place: they must be done before the caller gets them back.
  if (in_place && steps > 0) {
    for (int j = 0; j < n_; ++j) {
      if (j != r_) wait_consumed(j, steps - 1);
    }
  }
}

}  // namespace nodal::detail
