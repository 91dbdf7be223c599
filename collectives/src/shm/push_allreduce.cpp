// allreduce with every buffer in the arena (the in_place algorithm): each rank reduces its block
// from every input, a step at a time (into its own output, or into a private scratch when the
// outputs are streamed), and writes the reduced step into every other rank's output itself, so
// nothing waits between reduce-scatter and all-gather. Per rank that is one read and one write of
// the message, a plain copy's traffic; a reduce-scatter followed by a gather from the owners'
// outputs reads it 1 + (n-1)/n times. Source of the idea: the "two-shot" allreduce (reduce-scatter,
// all-gather) of the custom all-reduce kernels of TensorRT-LLM and vLLM over NVLink, with the
// all-gather done as writes into the peers' buffers (a put, MSCCL++'s primitive) instead of reads.
//
// Who touches what: block b of every input is read, and block b of every output written, by rank
// b alone, so the ranks need no step flags; an input that is its rank's output (in place) is read
// by the block's owner before it overwrites it. The only wait is at the end: a rank returns its
// buffers to the caller once every peer has finished reading its input and writing its output
// (`consumed`).
#include "shm/call.hpp"

#include "copy.hpp"
#include "reduce_kernels.hpp"

#include <algorithm>

namespace nodal::detail {
namespace {

/// Bytes of a rank's block reduced per step: the scratch stays in L1/L2 between the reduction
/// that writes it and the copies that read it.
constexpr std::size_t kPushStep = 32 * 1024;

/// Messages from this size on (bytes per rank) stream their outputs when out of place: 1.2-1.5x
/// faster than plain stores at 4-64 MiB, slower at 1-2 MiB, where outputs stay in cache.
constexpr std::size_t kPushStreamMinBytes = 4u << 20;

}  // namespace

void Call::run_push_allreduce() {
  const auto [begin, my_len] = line_block(r_, 0, call_.count);
  const std::size_t end = begin + my_len;
  // Out of place, large outputs are written with streaming stores (copy.hpp): their owners read
  // them only after the call, and no line is read before it is written. In place, each line written
  // was just read, and is still in cache: plain stores (streaming ones took 1.5-1.9x longer at
  // 16-64 MiB in the trials before bench/results/2026-11-27-push-allreduce.md).
  const bool stream = !all_in_place() && call_.count * esize_ >= kPushStreamMinBytes;
  const std::size_t step = std::max<std::size_t>(kPushStep / esize_, 1);
  if (stream && c_.scratch.size() < step * esize_) c_.scratch.resize(step * esize_);
  Sources srcs(n_);
  for (std::size_t at = begin; at < end; at += step) {
    // A failed job stops the writes into the peers' outputs (a peer that threw PeerFailure may
    // already have given its buffers back to its caller).
    check_job_alive();
    const std::size_t len = std::min(step, end - at);
    for (int j = 0; j < n_; ++j) srcs[j] = (j == r_ ? bytes(call_.input) : bytes(peer_input(j))) + at * esize_;
    // Reduced into the scratch when every output is streamed, else into my output, which then
    // stays in cache for the copies.
    std::byte* reduced = stream ? c_.scratch.data() : bytes(call_.output) + at * esize_;
    reduce_n(call_.dtype, call_.op, reduced, srcs.data(), n_, len);
    for (int j = 0; j < n_; ++j) {
      std::byte* out = (j == r_ ? bytes(call_.output) : bytes(peer_output(j))) + at * esize_;
      if (out != reduced) copy_bytes(out, reduced, len * esize_, stream);
    }
  }
  // Every output holds every block once every rank has published `consumed`.
  finish_with_peers();
}

}  // namespace nodal::detail
