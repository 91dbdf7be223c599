// nodal::cuda (the public face of the GPU layer), require_available and the copies, for a build
// with CUDA.
#include "common.hpp"
#include "driver.hpp"

#include <nodal/arena.hpp>
#include <nodal/errors.hpp>
#include <nodal/detail/environment.hpp>
#include <nodal/detail/finalize.hpp>
#include <nodal/detail/posix.hpp>
#include <nodal/detail/storage.hpp>

#include "block_table.hpp"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include <fmt/format.h>

namespace nodal {
namespace {

/// gpu.hpp cuda_initialized: set before this process's first call into CUDA.
std::atomic<bool> g_cuda_initialized{false};

struct Availability {
  int count = 0;
  std::string reason;  ///< empty when count > 0
};

/// Asked once per process: cudaGetDeviceCount loads the driver and cannot change its answer.
const Availability& availability() {
  static const Availability answer = [] {
    Availability a;
    // Even without a driver (cudaErrorInsufficientDriver) the runtime has loaded and looked:
    // say so whatever the answer, fork is refused either way (cheap to be strict here).
    detail::gpu::note_cuda_initialized();
    cudaError_t result = cudaGetDeviceCount(&a.count);
    if (result == cudaErrorNoDevice || (result == cudaSuccess && a.count == 0)) {
      a.count = 0;
      const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
      a.reason = visible ? fmt::format("no GPU visible (CUDA_VISIBLE_DEVICES='{}')", visible)
                         : std::string("no GPU visible (CUDA_VISIBLE_DEVICES unset)");
    } else if (result == cudaErrorInsufficientDriver) {
      a.count = 0;
      a.reason = fmt::format("no CUDA driver ({}: {})", cudaGetErrorName(result), cudaGetErrorString(result));
    } else if (result != cudaSuccess) {
      a.count = 0;
      a.reason = fmt::format("CUDA cannot start ({}: {})", cudaGetErrorName(result), cudaGetErrorString(result));
    }
    (void)cudaGetLastError();  // leave no error behind for the program's own checks
    // nodal::finalize at exit, registered after the CUDA runtime started (detail/finalize.hpp).
    if (a.count > 0) detail::finalize_at_exit();
    return a;
  }();
  return answer;
}

thread_local cuda::Stream t_stream = nullptr;

}  // namespace

namespace cuda {

bool built_with_cuda() noexcept { return true; }
bool built_with_nccl() noexcept {
#ifdef NODAL_WITH_NCCL
  return true;
#else
  return false;
#endif
}
bool available() noexcept {
  try {
    return availability().count > 0;
  } catch (...) {
    return false;
  }
}
std::string unavailable_reason() { return availability().reason; }
int device_count() noexcept {
  try {
    return availability().count;
  } catch (...) {
    return 0;
  }
}
Stream current_stream() noexcept { return t_stream; }
void set_current_stream(Stream stream) noexcept { t_stream = stream; }
void synchronize() {
  detail::gpu::require_available("cuda::synchronize");
  detail::gpu::check(cudaStreamSynchronize(t_stream), "cudaStreamSynchronize(current stream)");
}

}  // namespace cuda

namespace detail::gpu {

void note_cuda_initialized() noexcept { g_cuda_initialized.store(true, std::memory_order_release); }
bool cuda_initialized() noexcept { return g_cuda_initialized.load(std::memory_order_acquire); }

bool job_failed() noexcept {
  try {
    return job_arena_exists() && job_arena().control().abort.load(std::memory_order_acquire) != 0;
  } catch (...) {
    return false;
  }
}

void require_available(const char* what) {
  if (!cuda::available()) throw CudaError(fmt::format("{}: {}", what, cuda::unavailable_reason()));
}

const Self& self() {
  static const Self me = [] {
    Self s;
    std::string rank = getenv_or_empty(kEnvRank);
    std::string world = getenv_or_empty(kEnvWorldSize);
    s.rank = rank.empty() ? 0 : parse_int(rank);
    s.world_size = world.empty() ? 1 : parse_int(world);
    s.pid = ::getpid();
    if (s.world_size < 1 || s.world_size > kMaxRanks || s.rank < 0 || s.rank >= s.world_size) {
      throw UsageError(fmt::format("the GPU layer: RANK='{}' WORLD_SIZE='{}' do not name a rank of a job", rank, world));
    }
    register_rank(job_arena(), s.rank, s.pid);
    return s;
  }();
  return me;
}

BlockRecord& record_of(std::uint64_t offset) { return record_at(job_arena(), offset); }

bool quiesce_before_release(int device) noexcept {
  // Polled rather than cudaStreamSynchronize: a stream that waits on an event of a rank that died
  // may never finish, and this runs in releases, during stack unwinding and at exit. Once the
  // job has failed the memory is leaked on purpose (the caller keeps its reference: a dead
  // rank's references do not count, so the owner reuses the block once this rank is gone).
  if (job_failed()) return false;
  try {
    // Under the storage's device: the legacy default stream is per device, and on a thread with
    // no current context the query would otherwise create a primary context on device 0.
    const DeviceGuard guard(device);
    const cudaStream_t stream = cuda::current_stream();
    for (int polls = 0;; ++polls) {
      const cudaError_t result = cudaStreamQuery(stream);
      if (result != cudaErrorNotReady) {
        if (result != cudaSuccess) (void)cudaGetLastError();  // errors are ignored (gpu.hpp)
        return true;
      }
      if (job_failed()) return false;
      if (polls < 1000) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  } catch (...) {
    return true;  // CUDA errors are ignored (common.hpp), the guard's included
  }
}

namespace {
/// The device of the first of `a`, `b` that is device memory; the current context's device
/// otherwise (0 without one).
int device_of(const void* a, const void* b) {
  for (const void* p : {a, b}) {
    if (p == nullptr) continue;
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, p) == cudaSuccess && attributes.type == cudaMemoryTypeDevice) {
      return attributes.device;
    }
    (void)cudaGetLastError();
  }
  // cudaGetDevice says 0 on a thread that never chose a device: the same answer, said plainly.
  return current_device_or(0);
}
}  // namespace

void copy(void* dst, const void* src, std::size_t bytes) {
  require_available("a copy to or from a GPU");
  collect_limbo();
  if (bytes == 0) return;
  // The copy runs on the device that owns the GPU side (pool memory is accessible from its own
  // device only), on that device's view of the current stream.
  DeviceGuard guard(device_of(dst, src));
  cudaStream_t stream = cuda::current_stream();
  // cudaMemcpyDefault: the direction comes from the pointers (unified virtual addressing).
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream), "cudaMemcpyAsync");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize after a copy");
}

void register_host(void* base, std::size_t bytes) {
  require_available("pinning host memory");
  const cudaError_t rc = cudaHostRegister(base, bytes, cudaHostRegisterPortable);
  if (rc == cudaErrorHostMemoryAlreadyRegistered) {
    (void)cudaGetLastError();  // clears the sticky-free error state
    return;
  }
  check(rc, "cudaHostRegister");
}

void zero(void* dst, std::size_t bytes) {
  require_available("zeroing GPU memory");
  if (bytes == 0) return;
  DeviceGuard guard(device_of(dst, nullptr));
  cudaStream_t stream = cuda::current_stream();
  check(cudaMemsetAsync(dst, 0, bytes, stream), "cudaMemsetAsync");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize after a memset");
}

}  // namespace detail::gpu
}  // namespace nodal
