// The rank program of the NCCL backend's GPU tests (tests/gpu/nccl_test.cpp).
//
//   nccl_program ops     every collective x dtype x op (and send/recv with >= 2 ranks) on cuda
//                        tensors, each result compared bytewise with the same call on cpu
//                        tensors (the CPU path is the reference: "same semantics"). Inputs are
//                        small integers, so every sum, product and average is exact whatever the
//                        reduction order and the results must be identical. Rank 0 prints
//                        "nccl ops ok: <calls> calls" at the end; a mismatch exits 1, naming it.
//   nccl_program fault   (>= 2 ranks) allreduces in a loop; rank 1 SIGKILLs itself after a few
//                        while the others are inside one. The others must get PeerFailure:
//                        they print "rank R: PeerFailure after <ms> ms: <what>" and exit 3.
//
// The device: ctx.device() under `nodalrun --gpus`, cuda:0 otherwise (a singleton).
#include <nodal/communicator.hpp>
#include <nodal/cuda.hpp>
#include <nodal/errors.hpp>
#include <nodal/nodal.hpp>
#include <nodal/tensor.hpp>

#include <signal.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

namespace {

using nodal::Device;
using nodal::DType;
using nodal::ReduceOp;
using nodal::Tensor;

constexpr DType kDtypes[] = {DType::bool_, DType::u8,   DType::i8,  DType::i32, DType::i64,
                             DType::f16,   DType::bf16, DType::f32, DType::f64};
constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg};

std::uint16_t f32_to_half_bits(float value, DType dtype) {
  if (dtype == DType::bf16) {
    std::uint32_t bits;
    std::memcpy(&bits, &value, 4);
    return static_cast<std::uint16_t>(bits >> 16);  // small integers: exact
  }
  const _Float16 half = static_cast<_Float16>(value);
  std::uint16_t bits;
  std::memcpy(&bits, &half, 2);
  return bits;
}

/// Rank `rank`'s input on the CPU: small values (1..3, bool 0/1), so every reduction is exact.
Tensor make_input(DType dtype, std::int64_t count, int rank, int salt) {
  Tensor t = Tensor::empty({count}, dtype);
  auto* p = static_cast<std::byte*>(t.data());
  const std::size_t esize = nodal::element_size(dtype);
  for (std::int64_t i = 0; i < count; ++i) {
    const int v = static_cast<int>((rank * 7 + i * 3 + salt) % 3) + 1;
    std::byte* e = p + static_cast<std::size_t>(i) * esize;
    switch (dtype) {
      case DType::bool_: *reinterpret_cast<std::uint8_t*>(e) = static_cast<std::uint8_t>(v == 2); break;
      case DType::u8: *reinterpret_cast<std::uint8_t*>(e) = static_cast<std::uint8_t>(v); break;
      case DType::i8: *reinterpret_cast<std::int8_t*>(e) = static_cast<std::int8_t>(rank % 2 ? -v : v); break;
      case DType::i32: {
        const std::int32_t x = rank % 2 ? -v : v;
        std::memcpy(e, &x, 4);
        break;
      }
      case DType::i64: {
        const std::int64_t x = rank % 2 ? -v : v;
        std::memcpy(e, &x, 8);
        break;
      }
      case DType::f16:
      case DType::bf16: {
        const std::uint16_t x = f32_to_half_bits(static_cast<float>(v), dtype);
        std::memcpy(e, &x, 2);
        break;
      }
      case DType::f32: {
        const float x = static_cast<float>(v);
        std::memcpy(e, &x, 4);
        break;
      }
      case DType::f64: {
        const double x = v;
        std::memcpy(e, &x, 8);
        break;
      }
    }
  }
  return t;
}

struct Checker {
  nodal::Communicator comm;
  Device device;
  long calls = 0;

  Tensor gpu(const Tensor& cpu) const { return cpu.to(device); }

  void same(const Tensor& gpu_result, const Tensor& cpu_result, const std::string& what) {
    ++calls;
    const Tensor back = gpu_result.to(Device{});
    if (back.nbytes() != cpu_result.nbytes() || std::memcmp(back.data(), cpu_result.data(), back.nbytes()) != 0) {
      throw std::runtime_error("rank " + std::to_string(comm.rank()) + ": " + what + ": the GPU result differs from the CPU path's");
    }
    if (comm.last_algorithm() != "nccl") {
      throw std::runtime_error(what + ": took '" + comm.last_algorithm() + "', not nccl");
    }
  }
};

std::string name(const char* op, DType dtype, std::int64_t count, ReduceOp rop) {
  return std::string(op) + "(" + std::string(nodal::dtype_name(dtype)) + " x " + std::to_string(count) + ", " +
         nodal::reduce_op_name(rop) + ")";
}
std::string name(const char* op, DType dtype, std::int64_t count) {
  return std::string(op) + "(" + std::string(nodal::dtype_name(dtype)) + " x " + std::to_string(count) + ")";
}

void run_ops(nodal::Communicator comm, Device device) {
  Checker check{comm, device};
  const int rank = comm.rank();
  const int n = comm.world_size();
  const int root = n - 1;  // not 0, so that a root mix-up shows with several ranks
  for (std::int64_t count : {std::int64_t{1}, std::int64_t{1000}, std::int64_t{1} << 19}) {
    for (DType dtype : kDtypes) {
      const std::int64_t blocks = count * n;
      for (ReduceOp op : kOps) {
        if (dtype == DType::bool_ && op == ReduceOp::avg) continue;  // UsageError on both paths
        // allreduce, out of place and in place.
        {
          Tensor in = make_input(dtype, count, rank, 0), want = Tensor::empty({count}, dtype);
          comm.allreduce(in, want, op);
          Tensor g_in = check.gpu(in), g_out = Tensor::empty({count}, dtype, device);
          comm.allreduce(g_in, g_out, op);
          check.same(g_out, want, name("allreduce", dtype, count, op));
          comm.allreduce(g_in, op);
          check.same(g_in, want, name("allreduce in place", dtype, count, op));
        }
        // reduce (in place; only root's result is defined).
        {
          Tensor cpu = make_input(dtype, count, rank, 1);
          Tensor g = check.gpu(cpu);
          comm.reduce(cpu, op, root);
          comm.reduce(g, op, root);
          if (rank == root) check.same(g, cpu, name("reduce", dtype, count, op));
        }
        // reduce_scatter.
        {
          Tensor in = make_input(dtype, blocks, rank, 2), want = Tensor::empty({count}, dtype);
          comm.reduce_scatter(in, want, op);
          Tensor g_out = Tensor::empty({count}, dtype, device);
          comm.reduce_scatter(check.gpu(in), g_out, op);
          check.same(g_out, want, name("reduce_scatter", dtype, count, op));
        }
      }
      // broadcast.
      {
        Tensor cpu = make_input(dtype, count, rank, 3);
        Tensor g = check.gpu(cpu);
        comm.broadcast(cpu, root);
        comm.broadcast(g, root);
        check.same(g, cpu, name("broadcast", dtype, count));
      }
      // allgather, gather, scatter, alltoall.
      {
        Tensor in = make_input(dtype, count, rank, 4), want = Tensor::empty({blocks}, dtype);
        comm.allgather(in, want);
        Tensor g_out = Tensor::empty({blocks}, dtype, device);
        comm.allgather(check.gpu(in), g_out);
        check.same(g_out, want, name("allgather", dtype, count));

        Tensor gathered = Tensor::empty({blocks}, dtype);
        comm.gather(in, gathered, root);
        Tensor g_gathered = Tensor::empty({blocks}, dtype, device);
        comm.gather(check.gpu(in), g_gathered, root);
        if (rank == root) check.same(g_gathered, gathered, name("gather", dtype, count));

        Tensor all = make_input(dtype, blocks, rank, 5), part = Tensor::empty({count}, dtype);
        comm.scatter(all, part, root);
        Tensor g_part = Tensor::empty({count}, dtype, device);
        comm.scatter(check.gpu(all), g_part, root);
        check.same(g_part, part, name("scatter", dtype, count));

        Tensor exchanged = Tensor::empty({blocks}, dtype);
        comm.alltoall(all, exchanged);
        Tensor g_exchanged = Tensor::empty({blocks}, dtype, device);
        comm.alltoall(check.gpu(all), g_exchanged);
        check.same(g_exchanged, exchanged, name("alltoall", dtype, count));
      }
      // send/recv around a ring (needs a peer).
      if (n >= 2) {
        const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
        Tensor mine = make_input(dtype, count, rank, 6);
        Tensor want = make_input(dtype, count, prev, 6);
        Tensor g_in = check.gpu(mine), g_out = Tensor::empty({count}, dtype, device);
        // Even ranks send first, odd ranks receive first: a rendezvous ring cannot deadlock.
        if (rank % 2 == 0) {
          comm.send(g_in, next);
          comm.recv(g_out, prev);
        } else {
          comm.recv(g_out, prev);
          comm.send(g_in, next);
        }
        ++check.calls;
        const Tensor back = g_out.to(Device{});
        if (std::memcmp(back.data(), want.data(), want.nbytes()) != 0) {
          throw std::runtime_error("rank " + std::to_string(rank) + ": " + name("recv", dtype, count) + " differs");
        }
      }
    }
  }
  comm.barrier(device);
  if (rank == 0) std::printf("nccl ops ok: %ld calls on %d rank(s)\n", check.calls + 1, n);
}

int run_fault(const nodal::Context& ctx, nodal::Communicator comm, Device device) {
  if (comm.world_size() < 2) {
    std::fprintf(stderr, "fault mode needs >= 2 ranks\n");
    return 2;
  }
  // Survivors end by PeerFailure, not by nodalrun's SIGTERM (it follows the abort word at once).
  if (ctx.rank() != 1) ::signal(SIGTERM, SIG_IGN);
  Tensor t = Tensor::zeros({std::int64_t{16} << 20}, DType::f32, device);  // 64 MiB: calls last a while
  using Clock = std::chrono::steady_clock;
  auto started = Clock::now();
  try {
    for (int i = 0;; ++i) {
      if (ctx.rank() == 1 && i == 5) {
        std::printf("rank 1: dying now\n");
        std::fflush(stdout);
        ::raise(SIGKILL);
      }
      started = Clock::now();
      comm.allreduce(t);
    }
  } catch (const nodal::PeerFailure& e) {
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - started).count();
    std::printf("rank %d: PeerFailure after %.1f ms: %s\n", ctx.rank(), ms, e.what());
    std::fflush(stdout);
    // Later calls fail at once as well.
    try {
      comm.allreduce(t);
      std::printf("rank %d: a later call did not throw\n", ctx.rank());
      return 4;
    } catch (const nodal::Error& later) {
      std::printf("rank %d: later call: %s\n", ctx.rank(), later.what());
    }
    return 3;
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    nodal::Context ctx = nodal::init();
    const std::string mode = argc > 1 ? argv[1] : "ops";
    Device device = ctx.device();
    if (device.kind != Device::Kind::cuda) device = Device::cuda(0);
    nodal::Communicator comm = ctx.world();
    if (mode == "ops") {
      run_ops(comm, device);
      nodal::finalize();  // ncclCommFinalize + ncclCommDestroy now, not after main
      return 0;
    }
    if (mode == "fault") return run_fault(ctx, comm, device);
    std::fprintf(stderr, "usage: nccl_program ops|fault\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nccl_program: %s\n", e.what());
    return 1;
  }
}
