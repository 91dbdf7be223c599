// The shared-memory algorithms behind every Communicator call. Internal.
#pragma once

#include "comm_state.hpp"

namespace nodal::detail {

inline std::byte* bytes(void* p) { return static_cast<std::byte*>(p); }
inline const std::byte* bytes(const void* p) { return static_cast<const std::byte*>(p); }
inline std::size_t ceil_div(std::size_t a, std::size_t b) { return (a + b - 1) / b; }

/// One collective call as the caller made it (arguments already checked for this rank).
struct CollCall {
  CollKind kind;
  const void* input;
  void* output;
  std::size_t count;  ///< elements, as the public call defines it for `kind`
  DType dtype;
  ReduceOp op;
  int root;  ///< -1 for calls without one
  /// True for a call on cuda tensors: run_collective only checks that every member makes the same
  /// call (the same header exchange, so the same UsageError on every rank); the GPU backend then
  /// moves the data. A cpu call and a cuda call at the same point are a mismatch.
  bool on_gpu = false;
  /// v-variants (shm/vector_collectives.hpp): world_size counts each, in elements, where the call
  /// defines them (nullptr elsewhere); `count` is then this rank's own part.
  const std::size_t* counts = nullptr;
  const std::size_t* recv_counts = nullptr;  ///< alltoallv only
};

/// Runs `call` on `comm` (every member makes the same call); for an on_gpu call, only the
/// agreement check. Throws UsageError when the members' calls differ, PeerFailure when the job
/// fails while waiting.
void run_collective(CommState& comm, const CollCall& call);

/// Point-to-point over the pair's channel (rendezvous: send returns once recv has copied it all).
void send_message(CommState& comm, const void* input, std::size_t count, DType dtype, int peer, int tag);
void recv_message(CommState& comm, void* output, std::size_t count, DType dtype, int peer, int tag);

}  // namespace nodal::detail
