// Rank program of the CUDA IPC collectives tests: `ipc_program MODE [KEY=VALUE...]` under
// `nodalrun --gpus 0 --ranks-per-gpu N -n N` (every rank on one GPU: the CUDA IPC path).
//
// The reference is nodal's CPU path: each case runs the collective on cuda tensors, then the same
// collective on host copies of the same inputs through the shared-memory Communicator, and the two
// results must be bitwise equal (the CPU path is itself checked against scalar loops by
// tests/programs/coll_program.cpp). Inputs are bit patterns, not nice numbers: random mantissas
// (rounding), exponents that overflow and underflow in prod, signed zeros, subnormals, quiet and
// signalling NaNs (one rank per index: a sum's result is then the NaN's quieted bits on both
// paths), opposite infinities on ranks 0 and 1 at the same index (inf - inf: x86's default NaN),
// and integers over their whole range (wrap-around).
//
// Modes:
//   matrix  colls=all|allreduce,reduce,broadcast,allgather,reduce_scatter,barrier dtypes=all|f32,...
//           ops=all|sum,... sizes=1,7,1003,70001,1048581 (elements per rank) seed=N
//           variants=rotate|all: rotate gives each case one of {in place, out of place} x {pool tensor
//           (Tensor::empty on cuda), cudaMalloc tensor (Tensor::from_cuda)}, taking turns; all runs
//           the four. Prints "rank R ok N checks in T ms"; a mismatch prints "FAIL rank R: ..." and
//           exits 1.
//   kill    count=N (f32 elements, default 64 MiB) victim=R delay_ms=N: every rank loops allreduce on
//           cuda tensors; the victim SIGKILLs itself after delay_ms; survivors print "rank R
//           PeerFailure after X ms" (X: from the victim's kill to the exception) and exit 0.
#include <cuda_runtime.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <nodal/communicator.hpp>
#include <nodal/cuda.hpp>
#include <nodal/nodal.hpp>
#include <nodal/sync.hpp>
#include <nodal/tensor.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using nodal::Communicator;
using nodal::Device;
using nodal::DType;
using nodal::ReduceOp;
using nodal::Tensor;
using Clock = std::chrono::steady_clock;

int g_rank = 0;

[[noreturn]] void fail(const std::string& what) {
  std::printf("FAIL rank %d: %s\n", g_rank, what.c_str());
  std::fflush(stdout);
  std::_Exit(1);
}

void check_cuda(cudaError_t error, const char* what) {
  if (error != cudaSuccess) fail(std::string(what) + ": " + cudaGetErrorString(error));
}

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

struct Options {
  std::map<std::string, std::string> values;
  std::string get(const std::string& key, const std::string& fallback) const {
    auto it = values.find(key);
    return it == values.end() ? fallback : it->second;
  }
  long get(const std::string& key, long fallback) const {
    auto it = values.find(key);
    return it == values.end() ? fallback : std::stol(it->second);
  }
};

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) items.push_back(item);
  return items;
}

constexpr DType kDtypes[] = {DType::bool_, DType::u8, DType::i8, DType::i32, DType::i64,
                             DType::f16,   DType::bf16, DType::f32, DType::f64};
constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg};

// ---- Inputs: bit patterns from (seed, rank, index). ----

std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// A float bit pattern of `bits` total bits with `exp_bits` exponent bits, from the hash h.
std::uint64_t float_pattern(std::uint64_t h, int bits, int exp_bits, std::size_t i, int rank) {
  const int mant_bits = bits - 1 - exp_bits;
  const std::uint64_t bias = (1ull << (exp_bits - 1)) - 1;
  const std::uint64_t sign = (h >> 63) << (bits - 1);
  const std::uint64_t exp_all = (1ull << exp_bits) - 1;
  const std::uint64_t mant_mask = (1ull << mant_bits) - 1;
  const auto r = static_cast<std::size_t>(rank);
  if (i % 101 == 7 + r) return sign | (exp_all << mant_bits) | (1ull << (mant_bits - 1)) | ((h >> 8) & (mant_mask >> 2));  // quiet NaN
  if (i % 131 == 9 + r) return (exp_all << mant_bits) | 1;  // signalling NaN
  if (i % 103 == 11 + r) return sign | (exp_all << mant_bits);  // an infinity
  if (i % 113 == 5 && rank <= 1) return (static_cast<std::uint64_t>(rank) << (bits - 1)) | (exp_all << mant_bits);  // +inf, -inf
  if (i % 127 == 3 && rank <= 1) return rank == 0 ? (exp_all << mant_bits) : 0;  // inf * 0
  if (i % 107 == 13) return sign;  // +-0
  if (i % 109 == 17 + r) return sign | (h & mant_mask);  // subnormal
  // Exponents within +-6 of the bias: sums round, products of 8 overflow f16 and bf16 stays exact-ish.
  const std::uint64_t exponent = bias - 6 + (h >> 20) % 13;
  return sign | (exponent << mant_bits) | (h & mant_mask);
}

void fill(Tensor& host, int rank, std::uint64_t seed, std::uint64_t salt) {
  const std::size_t count = static_cast<std::size_t>(host.numel());
  auto* bytes = static_cast<unsigned char*>(host.data());
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint64_t h = mix(seed * 0x9e3779b97f4a7c15ULL ^ mix(salt + static_cast<std::uint64_t>(rank) * 1000003u + i * 7919u));
    std::uint64_t value = 0;
    switch (host.dtype()) {
      case DType::bool_: value = h & 1; break;
      case DType::u8:
      case DType::i8:
      case DType::i32:
      case DType::i64:
        // Small magnitudes half the time (prod stays interesting), the whole range otherwise.
        value = (h & 1) ? h >> 1 : static_cast<std::uint64_t>(static_cast<std::int64_t>((h >> 8) % 9) - 4);
        break;
      case DType::f16: value = float_pattern(h, 16, 5, i, rank); break;
      case DType::bf16: value = float_pattern(h, 16, 8, i, rank); break;
      case DType::f32: value = float_pattern(h, 32, 8, i, rank); break;
      case DType::f64: value = float_pattern(h, 64, 11, i, rank); break;
    }
    const std::size_t es = nodal::element_size(host.dtype());
    std::memcpy(bytes + i * es, &value, es);  // little-endian: the low bytes
  }
}

// ---- GPU tensors of both kinds. ----

enum class Memory { pool, cuda_malloc };

Tensor gpu_empty(std::int64_t count, DType dtype, Memory memory, int device) {
  if (memory == Memory::pool) return Tensor::empty({count}, dtype, Device::cuda(device));
  void* data = nullptr;
  const std::size_t bytes = std::max<std::size_t>(1, static_cast<std::size_t>(count) * nodal::element_size(dtype));
  check_cuda(cudaMalloc(&data, bytes), "cudaMalloc");
  return Tensor::from_cuda(data, {count}, dtype, device, [data] { cudaFree(data); });
}

void to_gpu(const Tensor& gpu, const Tensor& host) {
  if (host.nbytes() == 0) return;
  check_cuda(cudaMemcpy(gpu.data(), host.data(), host.nbytes(), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
}

Tensor to_host(const Tensor& gpu) {
  Tensor host = Tensor::empty(gpu.shape(), gpu.dtype());
  if (host.nbytes() > 0) check_cuda(cudaMemcpy(host.data(), gpu.data(), host.nbytes(), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  return host;
}

std::string hex(const Tensor& t, std::size_t i) {
  const std::size_t es = nodal::element_size(t.dtype());
  std::uint64_t value = 0;
  std::memcpy(&value, static_cast<const unsigned char*>(t.data()) + i * es, es);
  char text[32];
  std::snprintf(text, sizeof text, "0x%0*llx", static_cast<int>(es * 2), static_cast<unsigned long long>(value));
  return text;
}

/// Whether element i of a float tensor is a NaN (any sign, payload, quiet or signalling).
bool is_nan(const Tensor& t, std::size_t i) {
  std::uint64_t bits = 0;
  std::memcpy(&bits, static_cast<const unsigned char*>(t.data()) + i * nodal::element_size(t.dtype()),
              nodal::element_size(t.dtype()));
  switch (t.dtype()) {
    case DType::f16: return (bits & 0x7c00u) == 0x7c00u && (bits & 0x03ffu) != 0;
    case DType::bf16: return (bits & 0x7f80u) == 0x7f80u && (bits & 0x007fu) != 0;
    case DType::f32: return (bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0;
    case DType::f64:
      return (bits & 0x7ff0000000000000ull) == 0x7ff0000000000000ull && (bits & 0x000fffffffffffffull) != 0;
    default: return false;
  }
}

/// Bitwise equality, NaN payloads aside (the contract in communicator.hpp): where the CPU path has a
/// NaN the GPU must have a NaN, of any payload. Which NaN operand x86 SSE passes on depends on the
/// operand order GCC chose for `acc + x` (it may commute a float addition), so the CPU path itself
/// does not promise a payload. Reports the first difference in words.
void expect_equal(const Tensor& got, const Tensor& want, const std::string& what) {
  if (got.nbytes() != want.nbytes()) fail(what + ": sizes differ");
  if (got.nbytes() == 0 || std::memcmp(got.data(), want.data(), got.nbytes()) == 0) return;
  const std::size_t es = nodal::element_size(got.dtype());
  const std::size_t count = got.nbytes() / es;
  for (std::size_t i = 0; i < count; ++i) {
    if (std::memcmp(static_cast<const char*>(got.data()) + i * es, static_cast<const char*>(want.data()) + i * es, es) != 0 &&
        !(is_nan(got, i) && is_nan(want, i))) {
      fail(what + ": first difference at element " + std::to_string(i) + " of " + std::to_string(count) + ": gpu " +
           hex(got, i) + ", cpu reference " + hex(want, i));
    }
  }
}

// ---- The matrix. ----

struct Case {
  std::string coll;
  ReduceOp op;
  DType dtype;
  std::int64_t count;
  bool in_place;
  Memory memory;
  int root;
};

std::string describe(const Case& c) {
  return c.coll + " " + nodal::reduce_op_name(c.op) + " " + std::string(nodal::dtype_name(c.dtype)) + " count " +
         std::to_string(c.count) + (c.in_place ? " in place" : " out of place") +
         (c.memory == Memory::pool ? " pool" : " cudaMalloc") + " root " + std::to_string(c.root);
}

/// Runs one case on the GPU and on the CPU path; returns the number of checks (0 or 1).
int run_case(Communicator& comm, const Case& c, int device, std::uint64_t seed, std::uint64_t salt) {
  const int n = comm.world_size(), r = comm.rank();
  const std::int64_t count = c.count;
  if (c.coll == "allreduce" || c.coll == "reduce" || c.coll == "broadcast") {
    Tensor host_in = Tensor::empty({count}, c.dtype);
    fill(host_in, r, seed, salt);
    Tensor gpu_in = gpu_empty(count, c.dtype, c.memory, device);
    to_gpu(gpu_in, host_in);
    Tensor gpu_result;
    Tensor want = host_in.clone();
    if (c.coll == "allreduce") {
      if (c.in_place) {
        comm.allreduce(gpu_in, c.op);
        gpu_result = gpu_in;
      } else {
        gpu_result = gpu_empty(count, c.dtype, c.memory, device);
        comm.allreduce(gpu_in, gpu_result, c.op);
      }
      comm.allreduce(want, c.op);
    } else if (c.coll == "reduce") {
      comm.reduce(gpu_in, c.op, c.root);
      gpu_result = gpu_in;
      comm.reduce(want, c.op, c.root);
      if (r != c.root) return 0;  // only the root's result is defined
    } else {
      comm.broadcast(gpu_in, c.root);
      gpu_result = gpu_in;
      comm.broadcast(want, c.root);
    }
    expect_equal(to_host(gpu_result), want, describe(c));
    return 1;
  }
  if (c.coll == "allgather") {
    Tensor host_in = Tensor::empty({count}, c.dtype);
    fill(host_in, r, seed, salt);
    Tensor gpu_out = gpu_empty(count * n, c.dtype, c.memory, device);
    Tensor gpu_in = c.in_place ? gpu_out.slice(count * r, count * (r + 1)) : gpu_empty(count, c.dtype, c.memory, device);
    to_gpu(gpu_in, host_in);
    comm.allgather(gpu_in, gpu_out);
    Tensor want = Tensor::empty({count * n}, c.dtype);
    comm.allgather(host_in, want);
    expect_equal(to_host(gpu_out), want, describe(c));
    return 1;
  }
  if (c.coll == "reduce_scatter") {
    Tensor host_in = Tensor::empty({count * n}, c.dtype);
    fill(host_in, r, seed, salt);
    Tensor gpu_in = gpu_empty(count * n, c.dtype, c.memory, device);
    to_gpu(gpu_in, host_in);
    Tensor gpu_out = c.in_place ? gpu_in.slice(count * r, count * (r + 1)) : gpu_empty(count, c.dtype, c.memory, device);
    comm.reduce_scatter(gpu_in, gpu_out, c.op);
    Tensor want = Tensor::empty({count}, c.dtype);
    comm.reduce_scatter(host_in, want, c.op);
    expect_equal(to_host(gpu_out), want, describe(c));
    return 1;
  }
  if (c.coll == "barrier") {
    // The GPU barrier, with GPU work queued before it (it must finish, and nothing may hang).
    Tensor buffer = gpu_empty(std::max<std::int64_t>(count, 1), DType::u8, c.memory, device);
    check_cuda(cudaMemsetAsync(buffer.data(), r, static_cast<std::size_t>(buffer.numel()),
                               static_cast<cudaStream_t>(nodal::cuda::current_stream())), "cudaMemsetAsync");
    comm.barrier(Device::cuda(device));
    if (cudaStreamQuery(static_cast<cudaStream_t>(nodal::cuda::current_stream())) != cudaSuccess)
      fail("barrier returned before this rank's queued work finished");
    comm.barrier(Device::cuda(device));
    return 0;
  }
  fail("unknown collective " + c.coll);
}

bool defined(ReduceOp op, DType dtype) { return !(op == ReduceOp::avg && dtype == DType::bool_); }

int matrix(const nodal::Context& ctx, const Options& o) {
  Communicator comm = ctx.world();
  const int n = comm.world_size(), r = comm.rank();
  const int device = ctx.device().index;
  if (ctx.device().kind != Device::Kind::cuda) fail("no GPU given: run under nodalrun --gpus");
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  const auto seed = static_cast<std::uint64_t>(o.get("seed", 1L));
  std::vector<std::string> colls = {"allreduce", "reduce", "broadcast", "allgather", "reduce_scatter", "barrier"};
  if (o.get("colls", "all") != "all") colls = split(o.get("colls", "all"));
  std::vector<DType> dtypes(std::begin(kDtypes), std::end(kDtypes));
  if (o.get("dtypes", "all") != "all") {
    dtypes.clear();
    for (const std::string& name : split(o.get("dtypes", "")))
      for (DType d : kDtypes)
        if (nodal::dtype_name(d) == name) dtypes.push_back(d);
  }
  std::vector<ReduceOp> ops(std::begin(kOps), std::end(kOps));
  if (o.get("ops", "all") != "all") {
    ops.clear();
    for (const std::string& name : split(o.get("ops", "")))
      for (ReduceOp op : kOps)
        if (name == nodal::reduce_op_name(op)) ops.push_back(op);
  }
  std::vector<std::int64_t> sizes;
  for (const std::string& s : split(o.get("sizes", "1,7,1003,70001,1048581"))) sizes.push_back(std::stoll(s));
  const bool all_variants = o.get("variants", "rotate") == "all";

  const auto start = Clock::now();
  int checks = 0;
  std::uint64_t case_number = 0;
  for (const std::string& coll : colls) {
    const bool reducing = coll == "allreduce" || coll == "reduce" || coll == "reduce_scatter";
    for (DType dtype : dtypes) {
      for (ReduceOp op : reducing ? ops : std::vector<ReduceOp>{ReduceOp::sum}) {
        if (!defined(op, dtype)) continue;
        for (std::int64_t count : sizes) {
          for (int v = 0; v < 4; ++v) {
            const int variant = all_variants ? v : static_cast<int>(case_number % 4);
            Case c{coll, op, dtype, count, (variant & 1) != 0, (variant & 2) ? Memory::cuda_malloc : Memory::pool,
                   static_cast<int>(case_number % static_cast<std::uint64_t>(n))};
            checks += run_case(comm, c, device, seed, ++case_number);
            if (!all_variants) break;
          }
        }
      }
    }
  }
  for (int i = 0; i < 10; ++i) comm.barrier(Device::cuda(device));
  {
    Tensor one = gpu_empty(1, DType::f32, Memory::pool, device);
    check_cuda(cudaMemset(one.data(), 0, 4), "cudaMemset");
    comm.allreduce(one);  // so that last_algorithm() names the GPU path
  }
  const long ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
  std::printf("rank %d ok %d checks in %ld ms (%s)\n", r, checks, ms, comm.last_algorithm().c_str());
  return 0;
}

// ---- A rank dies mid-allreduce. ----

int kill_mode(const nodal::Context& ctx, const Options& o) {
  Communicator comm = ctx.world();
  const int n = comm.world_size(), r = comm.rank();
  const int device = ctx.device().index;
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  const int victim = static_cast<int>(o.get("victim", static_cast<long>(n - 1)));
  const long delay_ms = o.get("delay_ms", 500L);
  const std::int64_t count = o.get("count", 16L << 20);
  if (r != victim) ::signal(SIGTERM, SIG_IGN);  // PeerFailure, not nodalrun's SIGTERM, must end survivors
  nodal::Array<std::int64_t> died_at = nodal::Array<std::int64_t>::open("ipc_kill_died_at", 1);
  Tensor in = Tensor::zeros({count}, DType::f32, Device::cuda(device));
  Tensor out = Tensor::empty({count}, DType::f32, Device::cuda(device));
  comm.allreduce(in, out);  // scratch allocated, events opened: the kill lands in steady state
  comm.barrier();
  std::thread killer;
  if (r == victim) {
    killer = std::thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      std::atomic_ref<std::int64_t>(died_at.data()[0]).store(now_ns(), std::memory_order_release);
      ::raise(SIGKILL);
    });
  }
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  long calls = 0;
  try {
    while (Clock::now() < deadline) {
      comm.allreduce(in, out);
      ++calls;
    }
    fail("no PeerFailure within 30 s (" + std::to_string(calls) + " calls)");
  } catch (const nodal::PeerFailure& e) {
    const std::int64_t died = std::atomic_ref<std::int64_t>(died_at.data()[0]).load(std::memory_order_acquire);
    const double ms = died ? static_cast<double>(now_ns() - died) / 1e6 : -1.0;
    std::printf("rank %d PeerFailure after %.1f ms in call %ld: %s\n", r, ms, calls, e.what());
    std::fflush(stdout);
  }
  std::_Exit(0);  // the job has failed: skip destructors that would talk to the GPU
}

}  // namespace

int main(int argc, char** argv) {
  nodal::Context ctx = nodal::init();
  g_rank = ctx.rank();
  if (argc < 2) fail("usage: ipc_program matrix|kill [KEY=VALUE...]");
  Options o;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto eq = arg.find('=');
    if (eq == std::string::npos) fail("not KEY=VALUE: " + arg);
    o.values[arg.substr(0, eq)] = arg.substr(eq + 1);
  }
  const std::string mode = argv[1];
  try {
    if (mode == "matrix") {
      const int rc = matrix(ctx, o);
      nodal::finalize();  // the backend closes (waiting for its peers) while CUDA still runs
      return rc;
    }
    if (mode == "kill") return kill_mode(ctx, o);
  } catch (const std::exception& e) {
    fail(std::string("exception: ") + e.what());
  }
  fail("unknown mode " + mode);
}
