// What nodal::finalize() runs, and how it runs at exit before CUDA tears down. Internal: the GPU
// layer and the collectives register their releases here.
//
// Why: nodal's GPU resources (NCCL communicators, the CUDA IPC collectives' events, streams and
// scratch) must be released while the CUDA runtime still works. Left to static destructors they
// would run after main returns, possibly after CUDA began to unload (cudaErrorCudartUnloading),
// skipping ncclCommFinalize/ncclCommDestroy or failing inside NCCL at exit. torch asks for
// destroy_process_group() before exit for the same reason; nodal asks for nodal::finalize() and,
// for programs that forget it, runs it from an atexit handler registered after CUDA started:
// atexit handlers and static destructors run in reverse order of registration, so a handler
// registered after CUDA's own runs before CUDA's teardown.
#pragma once

#include <functional>

namespace nodal::detail {

/// Registers `hook` to run once, at nodal::finalize() (explicit or at exit). Hooks run in reverse
/// order of registration (like destructors); an exception from one is reported on stderr and the
/// others still run. Thread-safe. A hook registered after finalize() ran runs at once.
void at_finalize(std::function<void()> hook);

/// Registers an atexit handler that calls nodal::finalize(), now. The GPU layer calls it right
/// after its first CUDA call returns and whenever a GPU backend opens, so that the handler is
/// later than anything CUDA registered. Cheap after the first call of a burst; thread-safe.
void finalize_at_exit();

/// Whether nodal::finalize() has run (GPU calls after it are UsageErrors).
bool finalized() noexcept;

}  // namespace nodal::detail
