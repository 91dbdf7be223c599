// nodal-gpu-bench: allreduce and broadcast of cuda tensors through nodal's GPU collectives (the
// CUDA IPC path when ranks share a GPU), with two floors measured in the same run by rank 0 alone:
// cudaMemcpyAsync device-to-device of the same bytes ("cuda-memcpy": what HBM gives one copy) and,
// when built with NCCL, a one-rank NCCL allreduce ("nccl-1rank": NCCL's fixed cost, no peers).
//
// Run on the GPU machine (the peer: bench/peers/torch_gpu_bench.py, same columns):
//   for n in 2 4 8; do
//     build/launcher/nodalrun -n $n --gpus 0 --ranks-per-gpu $n build/bench/nodal-gpu-bench --csv gpu.csv
//   done
//   python3 bench/peers/torch_gpu_bench.py --ranks 2,4,8 --sizes 4KiB,1MiB,64MiB >> gpu.csv
//
// Columns: lib,op,ranks,bytes,usec,algbw_GBps,busbw_GBps,hbm_fraction (bench/nodal_bench.cpp's
// plus one). --ops allreduce-inplace adds in-place allreduce rows (lib "nodal-<path>-inplace"), the
// pairing for bench/peers/torch_nccl_bench.py: torch's all_reduce is in place, and a one-rank
// in-place NCCL allreduce copies nothing. usec: the median over back-to-back calls of the slowest rank's median (each call is
// synchronous: it returns once the result is on the GPU). algbw = bytes / usec; busbw as NCCL's
// tests (allreduce x 2(n-1)/n, broadcast x 1).
// hbm_fraction = traffic / time / 3e12 (the H100's ~3 TB/s of D2D copy traffic), with the traffic
// of an ideal reduce-scatter + all-gather reading inputs in place, for B bytes per rank on n ranks
// sharing one HBM: each rank reads its share of every input (n * B/n) and writes its share (B/n),
// then copies the n-1 other shares (read and write (n-1)/n * B each): (3n - 1) * B in all. nodal
// reads pool inputs (these tensors) in place in large calls but writes its share twice (output
// and the reduced area peers gather from), i.e. 3n * B: at full HBM speed the column reads
// (3n-1)/3n (0.83 for 2 ranks, 0.92 for 4, 0.96 for 8). Inputs outside the pool (cudaMalloc) and
// calls up to NODAL_IPC_ONE_PASS_MAX_BYTES are staged first (a D2D copy, 2B per rank: 5n * B,
// about 0.58). Broadcast: every non-root reads and writes B: 2(n-1) * B (a large pool buffer is
// read in place on the root; staging would add 2B). The floors: memcpy 2B; NCCL one rank, out of
// place, 2B.
#include <nodal/communicator.hpp>
#include <nodal/cuda.hpp>
#include <nodal/nodal.hpp>
#include <nodal/tensor.hpp>
#include <nodal/detail/units.hpp>

#include <cuda_runtime.h>
#ifdef NODAL_BENCH_NCCL
#include <nccl.h>
#endif

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using nodal::Device;
using nodal::DType;
using nodal::Tensor;
using Clock = std::chrono::steady_clock;

void check(cudaError_t error, const char* what) {
  if (error != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(error));
}

struct Options {
  std::string sizes = "4KiB,1MiB,64MiB";
  std::string ops = "allreduce,broadcast";
  double seconds = 0.5;  ///< timed calls per size: until this long, at least min_iters
  int min_iters = 20;
  int max_iters = 10000;
  int warmup = 5;
  bool floors = true;
  std::string csv;
};

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) items.push_back(item);
  return items;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

/// Times `call` back to back: warm-up, min_iters timed calls, then as many more as fill `seconds`
/// (at most max_iters, plus one after agreeing). `agree(k)` turns this rank's count into the one
/// every rank uses (the largest; identity for one process), so that every rank makes the same
/// collective calls: counts that each rank took from its own clock made the ranks' calls differ
/// (the first H100 run).
template <class Call, class Agree>
std::vector<double> time_calls(const Options& o, Call&& call, Agree&& agree) {
  for (int i = 0; i < o.warmup; ++i) call();
  std::vector<double> usec;
  auto timed = [&] {
    const auto t0 = Clock::now();
    call();
    usec.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  };
  const int first = std::max(1, std::min(o.min_iters, o.max_iters));
  for (int i = 0; i < first; ++i) timed();
  const double per_call = std::max(1e-3, median(usec));
  const double wanted = std::clamp(o.seconds * 1e6 / per_call, static_cast<double>(first), static_cast<double>(o.max_iters));
  // At least one timed call after agree(): the last call made is then a timed one, whose path
  // last_algorithm() names (agree's own collective runs on the CPU).
  const std::int64_t total = std::max<std::int64_t>(agree(static_cast<std::int64_t>(wanted)), first + 1);
  while (static_cast<std::int64_t>(usec.size()) < total) timed();
  return usec;
}

template <class Call>
std::vector<double> time_calls(const Options& o, Call&& call) {
  return time_calls(o, call, [](std::int64_t k) { return k; });
}

void print_row(FILE* out, const std::string& lib, const std::string& op, int ranks, std::size_t bytes, double usec,
               double busbw_factor, double traffic_bytes) {
  const double algbw = static_cast<double>(bytes) / (usec * 1e-6) / 1e9;
  const double hbm = traffic_bytes / (usec * 1e-6) / 3e12;
  std::fprintf(out, "%s,%s,%d,%zu,%.3f,%.6g,%.6g,%.4f\n", lib.c_str(), op.c_str(), ranks, bytes, usec, algbw,
               algbw * busbw_factor, hbm);
  std::fflush(out);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"nodal-gpu-bench: allreduce/broadcast of cuda tensors (run under nodalrun --gpus)"};
  app.add_option("--sizes", o.sizes, "bytes per rank, comma-separated (4KiB,1MiB,64MiB)");
  app.add_option("--ops", o.ops, "allreduce,allreduce-inplace,broadcast (default allreduce,broadcast)");
  app.add_option("--seconds", o.seconds, "timed time per size");
  app.add_option("--min-iters", o.min_iters)->check(CLI::PositiveNumber);
  app.add_option("--max-iters", o.max_iters)->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup);
  app.add_flag("!--no-floors", o.floors, "skip the cudaMemcpy and one-rank NCCL floors");
  app.add_option("--csv", o.csv, "rank 0 appends rows to FILE (default stdout)");
  CLI11_PARSE(app, argc, argv);

  nodal::Context ctx = nodal::init();
  nodal::Communicator comm = ctx.world();
  const int n = comm.world_size(), r = comm.rank();
  if (ctx.device().kind != Device::Kind::cuda) {
    std::fprintf(stderr, "nodal-gpu-bench: no GPU given (run under nodalrun --gpus 0 --ranks-per-gpu N): %s\n",
                 nodal::cuda::available() ? "" : nodal::cuda::unavailable_reason().c_str());
    return 2;
  }
  const int device = ctx.device().index;
  check(cudaSetDevice(device), "cudaSetDevice");
  const auto stream = static_cast<cudaStream_t>(nodal::cuda::current_stream());

  FILE* out = stdout;
  if (r == 0 && !o.csv.empty()) {
    out = std::fopen(o.csv.c_str(), "a");
    if (!out) throw std::runtime_error("cannot open --csv " + o.csv);
  }
  if (r == 0 && (o.csv.empty() || std::ftell(out) == 0)) std::fprintf(out, "lib,op,ranks,bytes,usec,algbw_GBps,busbw_GBps,hbm_fraction\n");

  for (const std::string& size_text : split(o.sizes)) {
    const std::size_t bytes = nodal::detail::parse_bytes(size_text);
    const auto count = static_cast<std::int64_t>(bytes / 4);
    Tensor in = Tensor::zeros({count}, DType::f32, Device::cuda(device));
    Tensor result = Tensor::empty({count}, DType::f32, Device::cuda(device));
    // The number of timed calls, the same on every rank (the largest rank's wish).
    auto agree = [&](std::int64_t k) {
      Tensor count_tensor = Tensor::empty({1}, DType::i64);
      count_tensor.data_ptr<std::int64_t>()[0] = k;
      comm.allreduce(count_tensor, nodal::ReduceOp::max);
      return count_tensor.data_ptr<std::int64_t>()[0];
    };
    for (const std::string& op : split(o.ops)) {
      std::vector<double> usec;
      double factor = 1, traffic = 0;
      std::string suffix;
      if (op == "allreduce") {
        usec = time_calls(o, [&] { comm.allreduce(in, result); }, agree);
        factor = 2.0 * (n - 1) / n;
        traffic = (3.0 * n - 1) * static_cast<double>(bytes);
      } else if (op == "allreduce-inplace") {  // torch.distributed's all_reduce is in place only
        usec = time_calls(o, [&] { comm.allreduce(in); }, agree);
        factor = 2.0 * (n - 1) / n;
        traffic = (3.0 * n - 1) * static_cast<double>(bytes);
        suffix = "-inplace";
      } else if (op == "broadcast") {
        usec = time_calls(o, [&] { comm.broadcast(in, 0); }, agree);
        traffic = 2.0 * (n - 1) * static_cast<double>(bytes);
      } else {
        throw std::runtime_error("unknown op " + op);
      }
      // The slowest rank's median; the GPU call's algorithm, before the CPU allreduce below replaces it.
      const std::string algorithm = comm.last_algorithm();
      double mine = median(usec);
      Tensor slowest = Tensor::empty({1}, DType::f64);
      slowest.data_ptr<double>()[0] = mine;
      comm.allreduce(slowest, nodal::ReduceOp::max);
      if (r == 0) print_row(out, "nodal-" + algorithm + suffix, suffix.empty() ? op : "allreduce", n, bytes, slowest.data_ptr<double>()[0], factor, traffic);
    }
    comm.barrier();
    if (r == 0 && o.floors) {
      // D2D copy of the same bytes: the one-copy floor and the machine's HBM figure.
      std::vector<double> copy = time_calls(o, [&] {
        check(cudaMemcpyAsync(result.data(), in.data(), bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
        check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      });
      print_row(out, "cuda-memcpy", "copy", 1, bytes, median(copy), 1, 2.0 * static_cast<double>(bytes));
#ifdef NODAL_BENCH_NCCL
      static ncclComm_t nccl = [] {
        ncclUniqueId id;
        ncclComm_t c;
        if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&c, 1, id, 0) != ncclSuccess)
          throw std::runtime_error("one-rank NCCL communicator failed");
        return c;
      }();
      std::vector<double> floor = time_calls(o, [&] {
        if (ncclAllReduce(in.data(), result.data(), static_cast<std::size_t>(count), ncclFloat32, ncclSum, nccl, stream) != ncclSuccess)
          throw std::runtime_error("ncclAllReduce failed");
        check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      });
      print_row(out, "nccl-1rank", "allreduce", 1, bytes, median(floor), 0, 2.0 * static_cast<double>(bytes));
#endif
    }
    comm.barrier();
  }
  if (out != stdout) std::fclose(out);
  nodal::finalize();  // GPU backends close while CUDA still runs
  return 0;
}
