// The GPU layer of a build without CUDA (NODAL_CUDA=OFF, or no nvcc at build time): nothing is
// available, and every call that needs a GPU throws CudaError saying why.
#include <nodal/cuda.hpp>
#include <nodal/errors.hpp>
#include <nodal/detail/gpu.hpp>

#include <fmt/format.h>

namespace nodal {
namespace cuda {

bool built_with_cuda() noexcept { return false; }
bool built_with_nccl() noexcept { return false; }
bool available() noexcept { return false; }
std::string unavailable_reason() { return "nodal was built without CUDA (no nvcc at build time, or NODAL_CUDA=OFF)"; }
int device_count() noexcept { return 0; }
Stream current_stream() noexcept { return nullptr; }
void set_current_stream(Stream) noexcept {}
void synchronize() { detail::gpu::require_available("cuda::synchronize"); }

}  // namespace cuda

namespace detail::gpu {

void require_available(const char* what) { throw CudaError(fmt::format("{}: {}", what, cuda::unavailable_reason())); }

DeviceGuard::DeviceGuard(int) { require_available("making a GPU current"); }
DeviceGuard::~DeviceGuard() = default;
bool cuda_initialized() noexcept { return false; }
void require_shareable_device(int, int) { require_available("sharing a GPU between processes"); }

std::shared_ptr<Storage> pool_allocate(int, std::size_t) {
  require_available("a cuda tensor");
  return nullptr;
}
PoolBlock pool_block(const Storage&) noexcept { return {}; }
std::optional<PoolBlock> find_pool_block(const void*, std::size_t) noexcept { return std::nullopt; }
void* map_pool_block(const PoolBlock&) {
  require_available("a GPU pool block");
  return nullptr;
}
std::shared_ptr<Storage> external_storage(void*, std::size_t, int, std::function<void()>) {
  require_available("Tensor::from_cuda");
  return nullptr;
}
WireTensor export_storage(const Storage&, cuda::Stream) {
  require_available("a cuda tensor in a queue");
  return {};
}
std::shared_ptr<Storage> import_storage(const WireTensor&, cuda::Stream) {
  require_available("a cuda tensor from a queue");
  return nullptr;
}
void release_wire(const WireTensor&) noexcept {}
void copy(void*, const void*, std::size_t) { require_available("a copy to or from a GPU"); }
void zero(void*, std::size_t) { require_available("zeroing GPU memory"); }
void register_host(void*, std::size_t) { require_available("pinning host memory"); }

}  // namespace detail::gpu
}  // namespace nodal
