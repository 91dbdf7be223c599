// CUDA tensor hand-off latency through TensorQueue, producer -> consumer, under nodalrun -n 2:
//   nodalrun -n 2 build/release/bench/gpu_handoff [--repeats N]
// For 1 KiB and 256 MiB (and sizes between), a pool tensor (Tensor::empty on cuda:0) ping-pongs
// between the ranks over two queues: each side gets it, makes its current stream wait for the
// sender's event (what get() does) and puts it back. One-way latency = round trip / 2, median of
// N round trips after a warm-up (the first trip imports the chunk and opens the event: ~0.5 ms,
// DESIGN.md "GPU facts"). The target is < 50 us at every size: the data never moves. Rank 0
// prints CSV: lib,what,bytes,usec. Without a usable GPU it prints one "skip" line and exits 0.
// The peer: bench/peers/torch_handoff.py (torch.multiprocessing, same measurement).
#include <nodal/cuda.hpp>
#include <nodal/nodal.hpp>
#include <nodal/tensor.hpp>
#include <nodal/tensor_queue.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  nodal::Context ctx = nodal::init();
  int repeats = 1000;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--repeats") == 0) repeats = std::max(1, std::atoi(argv[i + 1]));
  }
  if (!nodal::cuda::available()) {
    if (ctx.rank() == 0) std::printf("skip: gpu_handoff needs a GPU: %s\n", nodal::cuda::unavailable_reason().c_str());
    return 0;
  }
  if (ctx.world_size() != 2) {
    std::fprintf(stderr, "run me with nodalrun -n 2\n");
    return 2;
  }
  auto ping = nodal::TensorQueue::open("gpu-bench-ping", 2);
  auto pong = nodal::TensorQueue::open("gpu-bench-pong", 2);
  const std::vector<std::size_t> sizes = {1024, 1 << 20, 64 << 20, std::size_t{256} << 20};
  if (ctx.rank() == 0) std::printf("lib,what,bytes,usec\n");
  for (std::size_t bytes : sizes) {
    const int warmup = 10;
    if (ctx.rank() == 0) {
      nodal::Tensor t = nodal::Tensor::empty({static_cast<std::int64_t>(bytes)}, nodal::DType::u8, nodal::Device::cuda(0));
      std::vector<double> trips;
      trips.reserve(static_cast<std::size_t>(repeats));
      for (int i = 0; i < warmup + repeats; ++i) {
        auto start = Clock::now();
        ping.put(t);
        auto back = pong.get();
        trips.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
        t = back->tensor;
      }
      trips.erase(trips.begin(), trips.begin() + warmup);
      std::printf("nodal,pool_handoff_one_way,%zu,%.2f\n", bytes, median(trips) / 2);
      std::fflush(stdout);
    } else {
      for (int i = 0; i < warmup + repeats; ++i) {
        auto item = ping.get();
        pong.put(item->tensor);
      }
    }
  }
  return 0;
}
