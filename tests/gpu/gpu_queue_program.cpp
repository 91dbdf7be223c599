// Rank program of the GPU queue tests: `gpu_queue_program MODE [ARGS...]` under nodalrun. Rank 0
// produces CUDA tensors, the others consume them; every consumer copies each tensor back to the
// host and compares it with an independent reference, and prints what it found.
//   handoff COUNT BYTES pool|external   rank 0 sends COUNT tensors of BYTES to every other rank
//   producer_exits BYTES                rank 0 puts 4 tensors and exits; rank 1 gets them after
//   consumer_dies BYTES                 rank 1 dies holding rank 0's tensor; rank 0 reuses it
#include <nodal/cuda.hpp>
#include <nodal/nodal.hpp>
#include <nodal/tensor.hpp>
#include <nodal/tensor_queue.hpp>
#include <nodal/detail/gpu.hpp>
#include <nodal/detail/storage.hpp>

#ifdef NODAL_WITH_CUDA
#include <cuda_runtime_api.h>
#endif
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;

void fill_reference(std::byte* data, std::size_t bytes, std::uint64_t seed) {
  std::mt19937_64 random(seed * 0x9E3779B97F4A7C15ULL + 7);
  for (std::size_t i = 0; i < bytes; i += 8) {
    std::uint64_t word = random();
    std::memcpy(data + i, &word, std::min<std::size_t>(8, bytes - i));
  }
}

std::uint64_t seed_of(int consumer, int index) { return static_cast<std::uint64_t>(consumer) * 1000003u + index; }

#ifdef NODAL_WITH_CUDA
void check_cuda(cudaError_t result, const char* call) {
  if (result != cudaSuccess) throw std::runtime_error(std::string(call) + ": " + cudaGetErrorString(result));
}
#endif

/// A u8 CUDA tensor of `bytes` holding the reference for `seed`: from the pool (Tensor::to) or
/// from cudaMalloc (Tensor::from_cuda, freed by its release).
nodal::Tensor make_tensor(std::size_t bytes, std::uint64_t seed, bool pool) {
  nodal::Tensor host = nodal::Tensor::empty({static_cast<std::int64_t>(bytes)}, nodal::DType::u8);
  fill_reference(static_cast<std::byte*>(host.data()), bytes, seed);
  if (pool) return host.to(nodal::Device::cuda(0));
#ifndef NODAL_WITH_CUDA
  throw std::runtime_error("external CUDA memory needs a build with CUDA");
#else
  void* device = nullptr;
  check_cuda(cudaMalloc(&device, bytes), "cudaMalloc");
  check_cuda(cudaMemcpy(device, host.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  return nodal::Tensor::from_cuda(device, {static_cast<std::int64_t>(bytes)}, nodal::DType::u8, 0,
                                  [device] { (void)cudaFree(device); });
#endif
}

bool matches(const nodal::Tensor& t, std::uint64_t seed) {
  if (t.device() != nodal::Device::cuda(0)) return false;
  nodal::Tensor host = t.to(nodal::Device{});
  std::vector<std::byte> expected(host.nbytes());
  fill_reference(expected.data(), expected.size(), seed);
  return std::memcmp(expected.data(), host.data(), expected.size()) == 0;
}

int handoff(const nodal::Context& ctx, int count, std::size_t bytes, bool pool) {
  if (ctx.rank() == 0) {
    for (int r = 1; r < ctx.world_size(); ++r) {
      auto queue = nodal::TensorQueue::open("gpu-" + std::to_string(r), 4);
      for (int i = 0; i < count; ++i) queue.put({make_tensor(bytes, seed_of(r, i), pool), i, 0, {}});
    }
    // Keep external memory alive until the consumers are done (the producer-keeps-alive rule).
    auto done = nodal::TensorQueue::open("gpu-done", 64);
    for (int r = 1; r < ctx.world_size(); ++r) (void)done.get();
    std::printf("producer sent %d to %d consumers\n", count, ctx.world_size() - 1);
    return 0;
  }
  auto queue = nodal::TensorQueue::open("gpu-" + std::to_string(ctx.rank()), 4);
  int good = 0;
  for (int i = 0; i < count; ++i) {
    auto item = queue.get(60s);
    if (item && item->index == i && matches(item->tensor, seed_of(ctx.rank(), i))) ++good;
  }
  nodal::TensorQueue::open("gpu-done", 64).put(nodal::QueueItem{});
  std::printf("verified %d of %d\n", good, count);
  return good == count ? 0 : 1;
}

bool process_gone(pid_t pid) { return ::kill(pid, 0) != 0 && errno == ESRCH; }

bool wait_gone(pid_t pid) {
  for (auto until = std::chrono::steady_clock::now() + 30s; std::chrono::steady_clock::now() < until;) {
    if (process_gone(pid)) return true;
    std::this_thread::sleep_for(1ms);
  }
  return false;
}

int producer_exits(const nodal::Context& ctx, std::size_t bytes) {
  auto queue = nodal::TensorQueue::open("gpu-exit", 8);
  if (ctx.rank() == 0) {
    queue.put(nodal::QueueItem{{}, 0, ::getpid(), {}});
    for (int i = 0; i < 4; ++i) queue.put({make_tensor(bytes, seed_of(1, i), true), i, 0, {}});
    std::printf("producer put 4 and exits\n");
    return 0;  // every tensor of ours is dropped; only the queue holds them
  }
  if (ctx.rank() != 1) return 0;
  auto first = queue.get(60s);
  if (!first || !wait_gone(static_cast<pid_t>(first->label))) {
    std::printf("the producer did not exit\n");
    return 1;
  }
  int good = 0;
  for (int i = 0; i < 4; ++i) {
    auto item = queue.get(60s);
    if (item && matches(item->tensor, seed_of(1, i))) ++good;
  }
  std::printf("after the producer exited: verified %d of 4\n", good);
  return good == 4 ? 0 : 1;
}

int consumer_dies(const nodal::Context& ctx, std::size_t bytes) {
  auto to_consumer = nodal::TensorQueue::open("gpu-die-to", 2);
  auto back = nodal::TensorQueue::open("gpu-die-back", 2);
  if (ctx.rank() == 1) {
    auto item = to_consumer.get(60s);
    bool ok = item && matches(item->tensor, 42);
    back.put(nodal::QueueItem{{}, ok ? 1 : 0, ::getpid(), {}});
    std::fflush(stdout);
    std::_Exit(0);  // dies holding the tensor: no destructor drops its reference
  }
  if (ctx.rank() != 0) return 0;
  nodal::detail::gpu::PoolBlock first;
  {
    nodal::Tensor t = make_tensor(bytes, 42, true);
    first = nodal::detail::gpu::pool_block(*t.storage());
    to_consumer.put(t);
  }  // our references are gone; rank 1's remains
  auto reply = back.get(60s);
  if (!reply || reply->index != 1 || !wait_gone(static_cast<pid_t>(reply->label))) {
    std::printf("the consumer did not verify or did not die\n");
    return 1;
  }
  nodal::Tensor again = nodal::Tensor::empty({static_cast<std::int64_t>(bytes)}, nodal::DType::u8, nodal::Device::cuda(0));
  auto second = nodal::detail::gpu::pool_block(*again.storage());
  bool reused = second.chunk == first.chunk && second.offset == first.offset;
  std::printf("block %s after the consumer died\n", reused ? "reused" : "NOT reused");
  return reused ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  nodal::Context ctx = nodal::init();
  std::string mode = argc > 1 ? argv[1] : "";
  auto arg = [&](int i) { return argc > i ? std::strtoull(argv[i], nullptr, 10) : 0ULL; };
  if (mode == "handoff") {
    std::string kind = argc > 4 ? argv[4] : "pool";
    return handoff(ctx, static_cast<int>(arg(2)), arg(3), kind == "pool");
  }
  if (mode == "producer_exits") return producer_exits(ctx, arg(2));
  if (mode == "consumer_dies") return consumer_dies(ctx, arg(2));
  std::fprintf(stderr, "usage: gpu_queue_program handoff|producer_exits|consumer_dies ...\n");
  return 2;
}
