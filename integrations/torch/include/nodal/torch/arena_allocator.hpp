// torch's CPU allocator over nodal's job arena, opt-in: with it installed, every CPU tensor of at
// least `min_bytes` that torch allocates (parameters, gradients, DDP's gradient buckets) lives in
// the job's shared arena, so nodal's collectives take their in_place path on it (on 2 ranks an
// allreduce that moves a copy's traffic per rank, instead of bringing the peer's data across
// processes first). Smaller tensors, and any allocation the arena has no room for, come from the
// allocator that was there before (torch's own), so running out of arena never fails a tensor.
// The allocator leaves an eighth of the arena (48 MiB to 256 MiB) to nodal itself (communicators,
// queues, empty_shared tensors): checked under the arena's lock, so ranks allocating at once
// cannot pass it together. The idea is the one of PyTorch's pinned-memory and CUDA caching
// allocators: swap the memory under at::empty, not the program. Set it before DDP is made (DDP
// allocates its buckets then).
// - Cost: an arena allocation takes the node-wide arena lock (about 25 us for 16 MiB against
//   1-2 us from malloc on the 2-core VM): worth it for long-lived tensors, not for a program
//   that allocates many large temporaries.
// - fork: arena tensors are not copied on fork. A forked child (a DataLoader worker) that writes
//   one writes its parent's; a child never frees its parent's blocks, and its own tensors come
//   from torch's allocator.
// - torch.multiprocessing: torch does not know arena memory as shared, so share_memory_() (or
//   sending the tensor through an mp.Queue) copies it into a segment of torch's own and the
//   tensor leaves the arena. nodal_torch.empty_shared and nodal's queues keep it there.
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
/// a singleton with its own arena, and gets a warning). Throws c10::Error for min_bytes 0 or when
/// the arena cannot be mapped or torch keeps an allocator set with a higher priority (then nothing
/// changes). Calls are serialised, but c10::SetCPUAllocator is a plain global
/// store: call it before other threads allocate tensors (right after init_process_group).
void use_arena_allocator(std::size_t min_bytes = kArenaAllocatorMinBytes);

/// From now on no tensor goes to the arena (resize_() of storages made meanwhile included): every
/// allocation is the replaced allocator's. The arena allocator stays registered with torch, passing
/// everything on, so that blocks still in the arena are freed right however torch frees them
/// (mkldnn's raw_deallocate asks the current allocator). No-op when it is not installed.
void stop_arena_allocator();

/// The arena allocator's state in this process.
struct ArenaAllocatorStats {
  bool installed;          ///< placing tensors in the arena (use_arena_allocator, no stop since)
  std::size_t min_bytes;   ///< bytes: the smallest allocation it places in the arena
  std::size_t live_bytes;  ///< bytes of this process's tensors now in the arena (headers not counted)
  std::size_t fallbacks;   ///< allocations of min_bytes or more that the arena had no room for
};
ArenaAllocatorStats arena_allocator_stats() noexcept;

/// use_arena_allocator(NODAL_TORCH_ARENA_MIN_BYTES) when that variable is set (a byte count, with
/// nodalrun's suffixes: "1M", "256K"; "0" or empty: nothing). Called by ProcessGroupNodal::create,
/// so `nodalrun -x NODAL_TORCH_ARENA_MIN_BYTES=1M python3 train.py` needs no change to the script.
/// Throws c10::Error for a value that is not a byte count.
void use_arena_allocator_from_env();

}  // namespace nodal::torch_backend
