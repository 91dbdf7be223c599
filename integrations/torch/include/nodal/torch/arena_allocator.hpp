// torch's CPU allocator over nodal's job arena, opt-in: with it installed, every CPU tensor of at
// least `min_bytes` that torch allocates (parameters, gradients, DDP's gradient buckets) lives in
// the job's shared arena, so nodal's collectives take their in_place path on it (on 2 ranks an
// allreduce that moves a copy's traffic per rank, instead of bringing the peer's data across
// processes first). Smaller tensors, and any allocation the arena has no room for, come from the
// allocator that was there before (torch's own), so running out of arena never fails a tensor.
// The idea is the one of PyTorch's pinned-memory and CUDA caching allocators: swap the memory
// under at::empty, not the program. Set it before DDP is made (DDP allocates its buckets then).
// Like tensor.share_memory_(), arena tensors are not copied on fork: a forked child (a DataLoader
// worker) that writes one writes its parent's; a child never frees its parent's blocks.
#pragma once

#include <cstddef>

namespace nodal::torch_backend {

/// The smallest allocation the arena allocator places in the arena unless told otherwise: 1 MiB.
inline constexpr std::size_t kArenaAllocatorMinBytes = std::size_t{1} << 20;

/// Installs the arena allocator as torch's CPU allocator (c10::SetCPUAllocator): from now on, CPU
/// allocations of `min_bytes` (bytes, >= 1) or more are blocks of the job's arena (64-byte aligned,
/// uninitialised, like torch's own), the others torch's. Calling it again changes `min_bytes`.
/// Tensors allocated before keep their memory; tensors in the arena stay valid after
/// stop_arena_allocator(). Joins the job (nodal::init(); a process started without nodalrun is
/// a singleton with its own arena). Throws c10::Error for min_bytes 0 or when the arena cannot be
/// mapped. Thread-safe.
void use_arena_allocator(std::size_t min_bytes = kArenaAllocatorMinBytes);

/// Puts back the allocator use_arena_allocator() replaced. No-op when it is not installed.
void stop_arena_allocator();

/// Arena allocator statistics, this process: bytes of live tensors in the arena, and allocations
/// of min_bytes or more that the arena had no room for (so came from torch's allocator instead).
struct ArenaAllocatorStats {
  bool installed;
  std::size_t min_bytes;
  std::size_t arena_bytes;
  std::size_t fallbacks;
};
ArenaAllocatorStats arena_allocator_stats() noexcept;

/// use_arena_allocator(NODAL_TORCH_ARENA_MIN_BYTES) when that variable is set (a byte count, with
/// nodalrun's suffixes: "1M", "256K"; "0" or empty: nothing). Called by ProcessGroupNodal::create,
/// so `nodalrun -x NODAL_TORCH_ARENA_MIN_BYTES=1M python3 train.py` needs no change to the script.
/// Throws c10::Error for a value that is not a byte count.
void use_arena_allocator_from_env();

}  // namespace nodal::torch_backend
