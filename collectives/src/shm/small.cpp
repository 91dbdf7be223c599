// The small path: every rank's data rides in its call slot, right behind its header (for a few
// bytes in the same cache line: one transfer carries flag, description and data), and each rank
// reads what it needs from its peers' slots. shm/call.cpp decides who waits for whom.
#include "shm/call.hpp"

#include "copy.hpp"
#include "reduce_kernels.hpp"

#include <cstring>

namespace nodal::detail {

std::size_t contribution_bytes(const CollCall& call, int world_size, int rank) {
  const std::size_t n = call.count * element_size(call.dtype);
  switch (call.kind) {
    case CollKind::barrier: return 0;
    case CollKind::allreduce:
    case CollKind::reduce:
    case CollKind::allgather:
    case CollKind::gather:
    case CollKind::split: return n;
    case CollKind::broadcast: return rank == call.root ? n : 0;
    case CollKind::scatter:  // up to the end of the last block in the root's slot
      return rank == call.root ? scatter_slot_offset(world_size, world_size - 1, n) + n : 0;
    case CollKind::reduce_scatter:
    case CollKind::alltoall: return n * static_cast<std::size_t>(world_size);
    default: return 0;  // the v-variants stage elsewhere
  }
}

void Call::run_small() {
  const std::size_t n = call_.count * esize_;
  switch (call_.kind) {
    case CollKind::allreduce:
    case CollKind::reduce: {
      if (call_.kind == CollKind::reduce && r_ != call_.root) return;
      Sources srcs(n_);
      for (int j = 0; j < n_; ++j) srcs[j] = j == r_ ? call_.input : c_.inline_data(j, seq_);
      reduce_n(call_.dtype, call_.op, call_.output, srcs.data(), n_, call_.count);
      return;
    }
    case CollKind::reduce_scatter: {
      Sources srcs(n_);
      for (int j = 0; j < n_; ++j) srcs[j] = (j == r_ ? bytes(call_.input) : c_.inline_data(j, seq_)) + r_ * n;
      reduce_n(call_.dtype, call_.op, call_.output, srcs.data(), n_, call_.count);
      return;
    }
    case CollKind::broadcast:
      if (r_ != call_.root) std::memcpy(call_.output, c_.inline_data(call_.root, seq_), n);
      return;
    case CollKind::allgather:
    case CollKind::gather:
    case CollKind::split:
      if (call_.kind == CollKind::gather && r_ != call_.root) return;
      for (int j = 0; j < n_; ++j) copy_bytes(bytes(call_.output) + j * n, j == r_ ? call_.input : c_.inline_data(j, seq_), n);
      return;
    case CollKind::scatter:
      copy_bytes(call_.output,
                 r_ == call_.root ? bytes(call_.input) + r_ * n
                                  : c_.inline_data(call_.root, seq_) + scatter_slot_offset(n_, r_, n),
                 n);
      return;
    case CollKind::alltoall:
      for (int j = 0; j < n_; ++j) {
        copy_bytes(bytes(call_.output) + j * n, (j == r_ ? bytes(call_.input) : c_.inline_data(j, seq_)) + r_ * n, n);
      }
      return;
    default: return;  // barrier moves no data; the v-variants never take this path
  }
}

}  // namespace nodal::detail
