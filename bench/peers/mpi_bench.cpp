// nodal-bench's measurement with MPI collectives (MPI_Allreduce, ...), for bench/compare.sh: the
// same loop, sizes, iteration policy, check and CSV (bench/collective_bench.hpp), so that the rows
// compare with nodal's. Built against Open MPI and MPICH alike:
//
//   mpicxx.openmpi -std=c++20 -O2 -I bench bench/peers/mpi_bench.cpp -o mpi_bench_openmpi
//   mpirun.openmpi -n 2 ./mpi_bench_openmpi --op allreduce
//   mpicxx.mpich -std=c++20 -O2 -I bench bench/peers/mpi_bench.cpp -o mpi_bench_mpich
//   mpiexec.mpich -n 2 ./mpi_bench_mpich --op allreduce
//
// The lib column is "openmpi" or "mpich", from MPI_Get_library_version (--lib overrides).
// Buffers are private memory, as an MPI user's are. --in-place uses MPI_IN_PLACE; for
// MPI_Reduce_scatter_block that leaves the result at the start of the buffer (MPI 4.0 sec. 6.10.2).
// The C API only: the deprecated C++ bindings add nothing here but warnings and a library.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <cstdio>
#include <exception>
#include <string>

#include "collective_bench.hpp"

namespace {

namespace cb = collective_bench;

MPI_Datatype to_mpi(cb::DType dtype) {
  switch (dtype) {
    case cb::DType::f64:
      return MPI_DOUBLE;
    case cb::DType::i32:
      return MPI_INT;
    case cb::DType::f32:
      break;
  }
  return MPI_FLOAT;
}

/// "openmpi", "mpich" or "mpi": what MPI_Get_library_version names.
std::string library_name() {
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  MPI_Get_library_version(version, &length);
  const std::string text(version, static_cast<std::size_t>(length));
  if (text.find("Open MPI") != std::string::npos) return "openmpi";
  if (text.find("MPICH") != std::string::npos) return "mpich";
  return "mpi";
}

class MpiBackend {
 public:
  MpiBackend() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size_);
  }

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  std::string name() const { return library_name(); }

  cb::Buffers allocate(std::size_t input_bytes, std::size_t output_bytes) {
    input_ = std::make_unique<cb::PageBuffer>(input_bytes);
    output_ = std::make_unique<cb::PageBuffer>(output_bytes);
    return {input_->data(), output_->data()};
  }

  void prepare(const cb::Call&) {}

  void run(const cb::Call& call) {
    const MPI_Datatype type = to_mpi(call.dtype);
    // Counts above INT_MAX would need MPI 4's _c calls; 64 MiB of floats is 16 M elements.
    const int count = static_cast<int>(call.count);
    switch (call.op) {
      case cb::Op::allreduce:
        MPI_Allreduce(call.in_place ? MPI_IN_PLACE : call.input, call.output, count, type, MPI_SUM, MPI_COMM_WORLD);
        return;
      case cb::Op::broadcast:
        MPI_Bcast(call.output, count, type, cb::kRoot, MPI_COMM_WORLD);
        return;
      case cb::Op::allgather:
        MPI_Allgather(call.in_place ? MPI_IN_PLACE : call.input, count, type, call.output, count, type, MPI_COMM_WORLD);
        return;
      case cb::Op::reduce_scatter:
        if (call.in_place) {
          MPI_Reduce_scatter_block(MPI_IN_PLACE, call.input, count, type, MPI_SUM, MPI_COMM_WORLD);
        } else {
          MPI_Reduce_scatter_block(call.input, call.output, count, type, MPI_SUM, MPI_COMM_WORLD);
        }
        return;
      case cb::Op::alltoall:
        MPI_Alltoall(call.input, count, type, call.output, count, type, MPI_COMM_WORLD);
        return;
      case cb::Op::reduce:
        MPI_Reduce(call.input, call.output, count, type, MPI_SUM, cb::kRoot, MPI_COMM_WORLD);
        return;
      case cb::Op::gather:
        MPI_Gather(call.input, count, type, call.output, count, type, cb::kRoot, MPI_COMM_WORLD);
        return;
      case cb::Op::scatter:
        MPI_Scatter(call.input, count, type, call.output, count, type, cb::kRoot, MPI_COMM_WORLD);
        return;
      case cb::Op::barrier:
        MPI_Barrier(MPI_COMM_WORLD);
        return;
      case cb::Op::pingpong: {
        const int last = cb::pingpong_peer(world_size_);
        if (rank_ == 0) {
          MPI_Send(call.input, count, type, last, 0, MPI_COMM_WORLD);
          MPI_Recv(call.output, count, type, last, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else if (rank_ == last) {
          MPI_Recv(call.output, count, type, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
          MPI_Send(call.output, count, type, 0, 0, MPI_COMM_WORLD);
        }
        return;
      }
    }
  }

  void barrier() { MPI_Barrier(MPI_COMM_WORLD); }

  double max_over_ranks(double value) {
    MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return value;
  }

  const void* result(const cb::Call& call) const {
    return call.in_place && call.op == cb::Op::reduce_scatter ? call.input : call.output;
  }
  std::string algorithm() const { return ""; }

 private:
  int rank_ = 0;
  int world_size_ = 1;
  std::unique_ptr<cb::PageBuffer> input_;
  std::unique_ptr<cb::PageBuffer> output_;
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  CLI::App app{"mpi_bench: nodal-bench's CSV for MPI collectives (run under mpirun / mpiexec)"};
  cb::Options options;
  cb::OptionText text;
  cb::add_options(app, options, text);
  try {
    app.parse(argc, argv);
    cb::finish_options(options, text);
  } catch (const CLI::ParseError& e) {
    const int code = cb::exit_for(app, e);
    MPI_Finalize();
    return code;
  }
  try {
    MpiBackend backend;
    cb::run_benchmark(backend, options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi_bench: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return 0;
}
