// nodal-bench: OSU-style latency and bandwidth of nodal's collectives, one rank per process.
//
//   nodalrun -n 2 build/release/bench/nodal-bench --op allreduce,broadcast --max-bytes 64M
//   nodalrun -n 2 --shm-size 4G build/release/bench/nodal-bench --buffers arena --check
//
// Rank 0 prints CSV rows lib,op,ranks,bytes,usec,algbw_GBps,busbw_GBps; the columns, the timing
// loops and the iteration policy are described in bench/collective_bench.hpp, which the Open MPI,
// MPICH and Gloo versions of this program (bench/peers/) share, so that bench/compare.sh compares
// libraries and nothing else.
//
// --buffers private (lib "nodal"): the buffers are private memory, as an MPI or torch user's are;
// the collectives copy them in and out of the arena. --buffers arena (lib "nodal-arena"): the
// buffers are Tensor::empty_shared, in the job's arena, so the in_place algorithm reads peers'
// buffers where they are (one copy less). Arena buffers take room in the arena: up to
// 2 * world_size * max-bytes per rank for allgather and alltoall; raise nodalrun's --shm-size.
#include <nodal/communicator.hpp>
#include <nodal/nodal.hpp>
#include <nodal/tensor.hpp>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "collective_bench.hpp"

namespace {

namespace cb = collective_bench;

nodal::DType to_nodal(cb::DType dtype) {
  switch (dtype) {
    case cb::DType::f64:
      return nodal::DType::f64;
    case cb::DType::i32:
      return nodal::DType::i32;
    case cb::DType::f32:
      break;
  }
  return nodal::DType::f32;
}

class NodalBackend {
 public:
  NodalBackend(nodal::Communicator comm, bool arena) : comm_(std::move(comm)), arena_(arena) {}

  int rank() const { return comm_.rank(); }
  int world_size() const { return comm_.world_size(); }
  std::string name() const { return arena_ ? "nodal-arena" : "nodal"; }

  cb::Buffers allocate(std::size_t input_bytes, std::size_t output_bytes) {
    // u8 tensors of the byte counts: the driver owns the element type of each call.
    auto make = [&](std::size_t bytes) {
      const std::vector<std::int64_t> shape = {static_cast<std::int64_t>(bytes)};
      return arena_ ? nodal::Tensor::empty_shared(shape, nodal::DType::u8)
                    : nodal::Tensor::empty(shape, nodal::DType::u8);
    };
    input_ = make(input_bytes);
    output_ = make(output_bytes);
    return {input_.data(), output_.data()};
  }

  void prepare(const cb::Call&) {}

  void run(const cb::Call& call) {
    const nodal::DType dtype = to_nodal(call.dtype);
    switch (call.op) {
      case cb::Op::allreduce:
        comm_.allreduce(call.input, call.output, call.count, dtype, nodal::ReduceOp::sum);
        return;
      case cb::Op::broadcast:
        comm_.broadcast(call.output, call.count, dtype, cb::kRoot);
        return;
      case cb::Op::allgather:
        comm_.allgather(call.input, call.output, call.count, dtype);
        return;
      case cb::Op::reduce_scatter:
        comm_.reduce_scatter(call.input, call.output, call.count, dtype, nodal::ReduceOp::sum);
        return;
      case cb::Op::alltoall:
        comm_.alltoall(call.input, call.output, call.count, dtype);
        return;
      case cb::Op::reduce:
        comm_.reduce(call.input, call.output, call.count, dtype, nodal::ReduceOp::sum, cb::kRoot);
        return;
      case cb::Op::gather:
        comm_.gather(call.input, call.output, call.count, dtype, cb::kRoot);
        return;
      case cb::Op::scatter:
        comm_.scatter(call.input, call.output, call.count, dtype, cb::kRoot);
        return;
      case cb::Op::barrier:
        comm_.barrier();
        return;
      case cb::Op::pingpong: {
        const int last = cb::pingpong_peer(comm_.world_size());
        if (comm_.rank() == 0) {
          comm_.send(call.input, call.count, dtype, last);
          comm_.recv(call.output, call.count, dtype, last);
        } else if (comm_.rank() == last) {
          comm_.recv(call.output, call.count, dtype, 0);
          comm_.send(call.output, call.count, dtype, 0);
        }
        return;
      }
    }
  }

  void barrier() { comm_.barrier(); }

  double max_over_ranks(double value) {
    comm_.allreduce(&value, &value, 1, nodal::DType::f64, nodal::ReduceOp::max);
    return value;
  }

  const void* result(const cb::Call& call) const { return call.output; }
  std::string algorithm() const { return comm_.last_algorithm(); }

 private:
  nodal::Communicator comm_;
  bool arena_;
  nodal::Tensor input_;
  nodal::Tensor output_;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"nodal-bench: OSU-style CSV of nodal's collectives (run under nodalrun -n N)"};
  cb::Options options;
  cb::OptionText text;
  cb::add_options(app, options, text);
  std::string buffers = "private";
  app.add_option("--buffers", buffers,
                 "private: buffers in process memory (lib nodal); arena: Tensor::empty_shared in the job's "
                 "arena, read in place by peers (lib nodal-arena)")
      ->check(CLI::IsMember({"private", "arena"}))
      ->capture_default_str();
  try {
    app.parse(argc, argv);
    cb::finish_options(options, text);
  } catch (const CLI::ParseError& e) {
    return cb::exit_for(app, e);
  }

  // Parsing comes first so that --help works without a job; init() joins it (or makes a singleton).
  nodal::Context ctx = nodal::init();
  NodalBackend backend(ctx.world(), buffers == "arena");
  cb::run_benchmark(backend, options);  // an exception reaches nodalrun through init()'s handler
  return 0;
}
