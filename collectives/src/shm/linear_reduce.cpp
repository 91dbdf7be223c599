// reduce of private buffers, folded by the root alone as the others stage their inputs: each
// non-root copies its input into its ring a segment at a time and returns once the last segment
// is staged; the root folds every rank's segment, in rank order, straight from the ring into its
// output, while the others stage the next ones. Open MPI's basic linear reduce
// (ompi_coll_base_reduce_intra_basic_linear), segmented so that staging and folding overlap.
//
// The root's work per byte is one fold (one pass over every rank's data); the pipelined shape
// (shm/pipelined_reduction.cpp) costs it a staging copy, a fold of its block and a copy of the
// peers' blocks, with two hand-offs per step; cma (shm/cma.cpp) a process_vm_readv of every
// peer's data before each fold, nothing overlapped.
#include "shm/call.hpp"

#include "reduce_kernels.hpp"

#include <algorithm>
#include <cstring>

namespace nodal::detail {
namespace {

/// Bytes per segment: the root starts folding once the first segment is staged, and each
/// segment costs one flag each way. 8, 16 and 32 KiB were alike at 512 KiB-8 MiB on 2 ranks
/// (bench/results/2026-11-28-linear-reduce.md).
constexpr std::size_t kLinearSegmentBytes = 16 * 1024;

}  // namespace

void Call::run_linear_reduce() {
  const std::size_t line = kCacheLine / esize_;
  // Each rank's part of the ring (ring_depth entries of chunk_bytes, contiguous) taken as a
  // circular buffer of segments.
  const std::size_t ring_bytes = c_.config.chunk_bytes * static_cast<std::size_t>(c_.config.ring_depth);
  const std::size_t segment =
      std::max<std::size_t>(std::min(kLinearSegmentBytes, ring_bytes / 2) / kCacheLine, 1) * line;
  const std::size_t slots = ring_bytes / (segment * esize_);
  const std::size_t steps = ceil_div(call_.count, segment);
  auto staged = [&](int j, std::size_t i) { return c_.stage(j, 0) + (i % slots) * segment * esize_; };
  const int root = call_.root;
  if (r_ != root) {
    for (std::size_t i = 0; i < steps; ++i) {
      if (i >= slots) wait_consumed(root, i - slots);
      const std::size_t begin = i * segment;
      const std::size_t len = std::min(segment, call_.count - begin);
      std::memcpy(staged(r_, i), bytes(call_.input) + begin * esize_, len * esize_);
      publish(c_, progress(r_).posted, flag(i));
    }
    return;
  }
  Sources srcs(n_);
  for (std::size_t i = 0; i < steps; ++i) {
    const std::size_t begin = i * segment;
    const std::size_t len = std::min(segment, call_.count - begin);
    for (int j = 0; j < n_; ++j) {
      if (j == r_) {
        srcs[j] = bytes(call_.input) + begin * esize_;
        continue;
      }
      wait_flag(c_, progress(j).posted, flag(i), "collective");
      srcs[j] = staged(j, i);
    }
    reduce_n(call_.dtype, call_.op, bytes(call_.output) + begin * esize_, srcs.data(), n_, len);
    publish(c_, progress(r_).consumed, flag(i));
  }
}

}  // namespace nodal::detail
