// cma: single copies from (process_vm_readv) and into (process_vm_writev) the peers' private
// memory (cross-memory attach, Open MPI's vader and MPICH's single-copy path), where
// shm/algorithm_table.hpp picks it:
// the copy collectives read peers' inputs straight into their outputs (shm/pipelined_copy.cpp),
// but gather's peers write their blocks into the root's output (run_cma_gather), so that the
// copies run on every rank's core rather than one after another on the root's;
// reduce's root reads the peers' inputs a chunk at a time into a private scratch buffer (on 2
// ranks out of place: into its output) and reduces them with its own, in rank order
// (run_cma_reduce); allreduce does the same for one
// block per rank, straight into its output, then reads the peers' reduced blocks out of their
// outputs (run_cma_allreduce: reduce-scatter + all-gather, 1.75 copies per byte against the
// pipelined path's 2.25), segment by segment; large ones in place write each reduced step into
// the peers' outputs with process_vm_writev instead (run_cma_push_allreduce, the one-pass shape of
// shm/push_allreduce.cpp). A rank whose memory is read or written returns only once the others
// say they are done (`consumed`; gather's root: the writers' `posted`).
#include "shm/call.hpp"

#include "copy.hpp"
#include "reduce_kernels.hpp"

#include <nodal/errors.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <sys/uio.h>

#include <fmt/format.h>

namespace nodal::detail {
namespace {

/// Bytes per peer per step of reduce: the scratch of all peers and the output step stay in L2.
constexpr std::size_t kCmaReduceStep = 128 * 1024;

/// Bytes of the message per segment of allreduce: what a rank reduces is still in cache when its
/// peer reads it back. 8 MiB: 1.33x the unsegmented path at 32 MiB in place, 1.26x at 64 MiB
/// (4 MiB: 1.02x and 1.25x; bench/results/2026-11-26-cma-allreduce.md).
constexpr std::size_t kCmaAllreduceSegment = 8 * 1024 * 1024;

/// allreduce in place from this size on (bytes per rank) writes each reduced block into the peers'
/// outputs (run_cma_push_allreduce) instead of letting them read it in segments: 1.18-1.54x faster
/// at 8-64 MiB in place, even or slower at 1-4 MiB and out of place
/// (bench/results/2026-11-27-push-allreduce.md).
constexpr std::size_t kCmaPushMinBytes = 8 * 1024 * 1024;

}  // namespace

void Call::cma_read(int j, void* dst, std::uintptr_t address, std::size_t n) const {
  cma_transfer(j, dst, address, n, false);
}

void Call::cma_write(int j, std::uintptr_t address, const void* src, std::size_t n) const {
  cma_transfer(j, const_cast<void*>(src), address, n, true);
}

void Call::cma_transfer(int j, void* mine, std::uintptr_t address, std::size_t n, bool write) const {
  std::size_t done = 0;
  while (done < n) {
    iovec local{static_cast<std::byte*>(mine) + done, n - done};
    iovec remote{reinterpret_cast<void*>(address + done), n - done};
    ssize_t got = write ? ::process_vm_writev(c_.progress[j].pid, &local, 1, &remote, 1, 0)
                        : ::process_vm_readv(c_.progress[j].pid, &local, 1, &remote, 1, 0);
    if (got <= 0) {
      int error = errno;
      check_job_alive();
      // Call::run marks the communicator broken with either error: every member learns it at
      // once, and every later call on it throws PeerFailure (not a mismatch with a peer that is a
      // call ahead).
      if (error == ESRCH) throw PeerFailure(fmt::format("rank {} of communicator '{}' is gone", j, c_.name));
      throw Error(fmt::format("{} rank {} (pid {}) failed: {}; set NODAL_CMA=0 to stage copies through shared "
                              "memory instead",
                              write ? "process_vm_writev to" : "process_vm_readv from", j, c_.progress[j].pid,
                              std::strerror(error)));
    }
    done += static_cast<std::size_t>(got);
  }
}

void Call::reduce_from_inputs(std::size_t begin, std::size_t count) {
  const std::size_t step = std::max<std::size_t>(kCmaReduceStep / esize_, 1);
  // On 2 ranks out of place the peer's part is read into the output and folded there (reduce_n
  // allows `out` to be a source): a third less memory in use than through a scratch buffer.
  const std::size_t total = call_.count * esize_;
  const auto in = reinterpret_cast<std::uintptr_t>(call_.input);
  const auto out = reinterpret_cast<std::uintptr_t>(call_.output);
  const bool into_output = n_ == 2 && (out + total <= in || in + total <= out);
  const std::size_t scratch_bytes = into_output ? 0 : static_cast<std::size_t>(n_) * step * esize_;
  if (c_.scratch.size() < scratch_bytes) c_.scratch.resize(scratch_bytes);
  Sources srcs(n_);
  for (std::size_t done = 0; done < count; done += step) {
    const std::size_t at = begin + done;
    const std::size_t len = std::min(step, count - done);
    std::byte* to_out = bytes(call_.output) + at * esize_;
    for (int j = 0; j < n_; ++j) {
      if (j == r_) {
        srcs[j] = bytes(call_.input) + at * esize_;
        continue;
      }
      std::byte* to = into_output ? to_out : c_.scratch.data() + static_cast<std::size_t>(j) * step * esize_;
      cma_read(j, to, c_.header(j, seq_).input_offset + at * esize_, len * esize_);
      srcs[j] = to;
    }
    reduce_n(call_.dtype, call_.op, to_out, srcs.data(), n_, len);
  }
}

void Call::run_cma_reduce() {
  const int root = call_.root;
  if (r_ != root) {
    // The root reads my input where it is: it must be done before the caller gets it back.
    wait_consumed(root, 0);
    return;
  }
  reduce_from_inputs(0, call_.count);
  publish(c_, progress(r_).consumed, flag(0));
}

void Call::run_cma_gather() {
  const int root = call_.root;
  const std::size_t block = call_.count * esize_;
  if (r_ != root) {
    // My block goes straight into the root's output: written with process_vm_writev, or copied
    // where the root's output is in the arena. Nothing of mine is read after this: I return.
    // As in run_cma_push_allreduce: no writes into a failed job's root. A peer already writing
    // when another rank dies may still write after the root has thrown PeerFailure and handed
    // its output back: only in a job that has failed, which ends every rank.
    check_job_alive();
    const CallHeader& theirs = c_.header(root, seq_);
    const std::uint64_t at = theirs.output_offset + static_cast<std::uint64_t>(r_) * block;
    if (theirs.out_arena) {
      copy_bytes(c_.arena->at(at), call_.input, block);
    } else {
      cma_write(root, at, call_.input, block);
    }
    publish(c_, progress(r_).posted, flag(0));
    return;
  }
  // The root copies its own block while the peers write theirs; it returns once they have.
  copy_bytes(bytes(call_.output) + static_cast<std::size_t>(r_) * block, call_.input, block);
  for (int j = 0; j < n_; ++j) {
    if (j != r_) wait_flag(c_, progress(j).posted, flag(0), "collective");
  }
}

void Call::run_cma_broadcast() {
  // The message cut as line_block cuts it: receivers read every block but the last from the
  // root's buffer while the root writes the last into each receiver's output, so that two copies
  // run at once instead of one while the root waits (bench/results/2026-12-02-split-broadcast.md).
  // A receiver whose memory cma may not write (and whose output is not in the arena) reads all.
  // Also when ranks outnumber cores: on 4 ranks sharing 2 cores 1.3-2x the speed of the receivers
  // reading it all at 128 KiB-32 MiB, the root's share taking the time it spent waiting.
  const int root = call_.root;
  const auto [tail, tail_len] = line_block(n_ - 1, 0, call_.count);
  auto pushed = [&](int q) { return tail_len != 0 && (c_.progress[q].cma != 0 || c_.header(q, seq_).out_arena); };
  if (r_ == root) {
    // As in run_cma_gather: no writes into a failed job's receivers.
    check_job_alive();
    const std::byte* from = bytes(call_.input) + tail * esize_;
    for (int q = 0; q < n_; ++q) {
      if (q == root || !pushed(q)) continue;
      const CallHeader& theirs = c_.header(q, seq_);
      const std::uint64_t at = theirs.output_offset + tail * esize_;
      if (theirs.out_arena) {
        copy_bytes(c_.arena->at(at), from, tail_len * esize_);
      } else {
        cma_write(q, at, from, tail_len * esize_);
      }
    }
    publish(c_, progress(r_).posted, flag(0));
    // The receivers read my buffer: it goes back to the caller once they are done.
    for (int q = 0; q < n_; ++q) {
      if (q != root) wait_consumed(q, 0);
    }
    return;
  }
  const bool mine_pushed = pushed(r_);
  const std::size_t reads = mine_pushed ? tail : call_.count;
  if (reads != 0) cma_read(root, call_.output, c_.header(root, seq_).input_offset, reads * esize_);
  publish(c_, progress(r_).consumed, flag(0));
  // My output is whole once the root's share has come too.
  if (mine_pushed) wait_flag(c_, progress(root).posted, flag(0), "collective");
}

void Call::run_cma_push_allreduce() {
  // My block, a step at a time: the peers' parts read into the scratch, reduced with mine into my
  // output, and written from there (still in cache) into every peer's output.
  const auto [begin, my_len] = line_block(r_, 0, call_.count);
  const std::size_t end = begin + my_len;
  const std::size_t step = std::max<std::size_t>(kCmaReduceStep / esize_, 1);
  for (std::size_t at = begin; at < end; at += step) {
    check_job_alive();  // as in shm/push_allreduce.cpp: no writes into a failed job's peers
    const std::size_t len = std::min(step, end - at);
    reduce_from_inputs(at, len);
    for (int j = 0; j < n_; ++j) {
      if (j != r_) cma_write(j, c_.header(j, seq_).output_offset + at * esize_, bytes(call_.output) + at * esize_, len * esize_);
    }
  }
  // Peers read my input and write my output: it goes back to the caller once they are done.
  finish_with_peers();
}

void Call::run_cma_allreduce() {
  if (all_in_place() && call_.count * esize_ >= kCmaPushMinBytes) {
    run_cma_push_allreduce();
    return;
  }
  // Segment by segment (kCmaAllreduceSegment bytes of the message each, so that what a rank
  // reduces is still in cache when its peer reads it back; one step flag per segment), block
  // b of a segment as line_block cuts it.
  const std::size_t line = kCacheLine / esize_;
  const std::size_t segment = std::max<std::size_t>(kCmaAllreduceSegment / esize_ / line, 1) * line;
  const std::size_t segments = std::max<std::size_t>(ceil_div(call_.count, segment), 1);
  for (std::size_t s = 0; s < segments; ++s) {
    const std::size_t first = s * segment;
    const std::size_t count = std::min(call_.count - first, segment);
    // Reduce-scatter: my block from every input, into my output.
    const auto [mine, my_len] = line_block(r_, first, count);
    reduce_from_inputs(mine, my_len);
    // Past this flag no peer reads this segment of my input (in place, my output: the peers
    // overwrite their block of it only after this).
    publish(c_, progress(r_).reduced, flag(s));
    // All-gather: every other block of the segment from its owner's output.
    for (int j = 0; j < n_; ++j) {
      if (j == r_) continue;
      wait_flag(c_, progress(j).reduced, flag(s), "collective");
      const auto [begin, len] = line_block(j, first, count);
      if (len != 0) {
        cma_read(j, bytes(call_.output) + begin * esize_, c_.header(j, seq_).output_offset + begin * esize_, len * esize_);
      }
    }
  }
  // The peers read my output: it goes back to the caller once they have.
  finish_with_peers();
}

}  // namespace nodal::detail
