// nodal-bench's measurement with Gloo's collectives (libgloo-dev, TCP transport over loopback), for
// bench/compare.sh: the same loop, sizes, iteration policy, check and CSV
// (bench/collective_bench.hpp), so that the rows compare with nodal's.
//
//   g++ -std=c++20 -O2 -I bench bench/peers/gloo_bench.cpp -lgloo -pthread -o gloo_bench
//   nodalrun -n 2 ./gloo_bench --op allreduce
//
// Any launcher that sets RANK and WORLD_SIZE (torchrun's names; nodalrun does) works; the ranks
// meet through a gloo::rendezvous::FileStore in --store-dir, by default a directory named after
// NODAL_JOB_ID under $TMPDIR (or /tmp), which rank 0 removes once every rank is connected.
//
// Calls: gloo::allreduce, broadcast, allgather, reduce, gather, scatter, alltoall and barrier with
// their options objects, built once per size (prepare(), untimed) and reused for every call, which
// is the cheapest way to call Gloo. Gloo 0.5 has no reduce_scatter options call: its
// ReduceScatterHalvingDoubling algorithm runs in place on the whole input and leaves this rank's
// block at the front, which run() then copies to the output (one memcpy of `bytes`, small next to
// Gloo's TCP time). Gloo is slow (~250 us per 4 B allreduce here): the default --max-iters is 2000.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/gather.h>
#include <gloo/math.h>
#include <gloo/reduce.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/scatter.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collective_bench.hpp"

namespace {

namespace cb = collective_bench;

/// The first of `names` set in the environment, as an int; -1 when none is.
int env_int(std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (const char* value = std::getenv(name)) return std::atoi(value);
  }
  return -1;
}

/// Gloo's element-wise reduction for T, as the options objects take it (math.h overloads sum()).
template <class T>
void (*sum_function())(void*, const void*, const void*, size_t) {
  return static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<T>);
}

class GlooBackend {
 public:
  GlooBackend(int rank, int world_size, const std::string& store_dir) {
    std::filesystem::create_directories(store_dir);
    gloo::rendezvous::FileStore file_store(store_dir);
    gloo::rendezvous::PrefixStore store("gloo_bench", file_store);
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";  // one node: loopback, whatever interfaces the machine has
    attr.ai_family = AF_INET;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, world_size);
    context->connectFullMesh(store, device);
    // 64 MiB over TCP with 4 ranks on 2 cores takes seconds; Gloo's 30 s default is near.
    context->setTimeout(std::chrono::seconds(300));
    context_ = context;
    barrier();
    if (rank == 0) std::filesystem::remove_all(store_dir);  // every rank is connected: files not needed
  }

  int rank() const { return context_->rank; }
  int world_size() const { return context_->size; }
  std::string name() const { return "gloo"; }

  cb::Buffers allocate(std::size_t input_bytes, std::size_t output_bytes) {
    input_ = std::make_unique<cb::PageBuffer>(input_bytes);
    output_ = std::make_unique<cb::PageBuffer>(output_bytes);
    return {input_->data(), output_->data()};
  }

  void prepare(const cb::Call& call) {
    cb::detail::with_type(call.dtype, [&](auto zero) { prepare_typed<decltype(zero)>(call); });
  }

  void run(const cb::Call&) { run_(); }

  void barrier() {
    gloo::BarrierOptions options(context_);
    gloo::barrier(options);
  }

  double max_over_ranks(double value) {
    gloo::AllreduceOptions options(context_);
    options.setOutput(&value, 1);
    options.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::max<double>));
    gloo::allreduce(options);
    return value;
  }

  const void* result(const cb::Call& call) const { return call.output; }
  std::string algorithm() const { return ""; }

 private:
  template <class T>
  void prepare_typed(const cb::Call& call) {
    const std::size_t count = call.count;
    const std::size_t blocks = count * static_cast<std::size_t>(world_size());
    T* input = static_cast<T*>(call.input);
    T* output = static_cast<T*>(call.output);
    switch (call.op) {
      case cb::Op::allreduce: {
        auto options = std::make_shared<gloo::AllreduceOptions>(context_);
        if (!call.in_place) options->setInput(input, count);
        options->setOutput(output, count);
        options->setReduceFunction(sum_function<T>());
        run_ = [options] { gloo::allreduce(*options); };
        return;
      }
      case cb::Op::broadcast: {
        auto options = std::make_shared<gloo::BroadcastOptions>(context_);
        options->setOutput(output, count);
        options->setRoot(cb::kRoot);
        run_ = [options] { gloo::broadcast(*options); };
        return;
      }
      case cb::Op::allgather: {
        auto options = std::make_shared<gloo::AllgatherOptions>(context_);
        if (!call.in_place) options->setInput(input, count);
        options->setOutput(output, blocks);
        run_ = [options] { gloo::allgather(*options); };
        return;
      }
      case cb::Op::reduce_scatter: {
        const std::vector<int> block_counts(static_cast<std::size_t>(world_size()), static_cast<int>(count));
        auto algorithm = std::make_shared<gloo::ReduceScatterHalvingDoubling<T>>(
            context_, std::vector<T*>{input}, static_cast<int>(blocks), block_counts);
        const std::size_t bytes = count * sizeof(T);
        run_ = [algorithm, input, output, bytes] {
          algorithm->run();
          if (output != input) std::memmove(output, input, bytes);
        };
        return;
      }
      case cb::Op::alltoall: {
        auto options = std::make_shared<gloo::AlltoallOptions>(context_);
        options->setInput(input, blocks);
        options->setOutput(output, blocks);
        run_ = [options] { gloo::alltoall(*options); };
        return;
      }
      case cb::Op::reduce: {
        auto options = std::make_shared<gloo::ReduceOptions>(context_);
        options->setInput(input, count);
        options->setOutput(output, count);
        options->setRoot(cb::kRoot);
        options->setReduceFunction(sum_function<T>());
        run_ = [options] { gloo::reduce(*options); };
        return;
      }
      case cb::Op::gather: {
        auto options = std::make_shared<gloo::GatherOptions>(context_);
        options->setInput(input, count);
        if (rank() == cb::kRoot) options->setOutput(output, blocks);
        options->setRoot(cb::kRoot);
        run_ = [options] { gloo::gather(*options); };
        return;
      }
      case cb::Op::scatter: {
        auto options = std::make_shared<gloo::ScatterOptions>(context_);
        if (rank() == cb::kRoot) {
          std::vector<T*> blocks_of_input;
          for (int r = 0; r < world_size(); ++r) blocks_of_input.push_back(input + static_cast<std::size_t>(r) * count);
          options->setInputs(blocks_of_input, count);
        }
        options->setOutput(output, count);
        options->setRoot(cb::kRoot);
        run_ = [options] { gloo::scatter(*options); };
        return;
      }
      case cb::Op::barrier: {
        auto options = std::make_shared<gloo::BarrierOptions>(context_);
        run_ = [options] { gloo::barrier(*options); };
        return;
      }
      case cb::Op::pingpong: {  // gloo's point-to-point: unbound buffers
        const std::size_t bytes = count * sizeof(T);
        std::shared_ptr<gloo::transport::UnboundBuffer> in = context_->createUnboundBuffer(input, bytes);
        std::shared_ptr<gloo::transport::UnboundBuffer> out = context_->createUnboundBuffer(output, bytes);
        const int last = cb::pingpong_peer(world_size());
        const int me = rank();
        run_ = [in, out, last, me] {
          constexpr std::uint64_t kSlot = 1;
          if (me == 0) {
            in->send(last, kSlot);
            in->waitSend();
            out->recv(last, kSlot);
            out->waitRecv();
          } else if (me == last) {
            out->recv(0, kSlot);
            out->waitRecv();
            out->send(0, kSlot);
            out->waitSend();
          }
        };
        return;
      }
    }
  }

  std::shared_ptr<gloo::Context> context_;
  std::function<void()> run_;
  std::unique_ptr<cb::PageBuffer> input_;
  std::unique_ptr<cb::PageBuffer> output_;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "gloo_bench: nodal-bench's CSV for Gloo collectives (run under nodalrun -n N, or with RANK, WORLD_SIZE)"};
  cb::Options options;
  options.max_iters = 2000;  // ~0.5 s per size at Gloo's ~250 us per small call
  cb::OptionText text;
  cb::add_options(app, options, text);
  std::string store_dir;
  app.add_option("--store-dir", store_dir, "rendezvous directory (default: $TMPDIR/nodal-gloo-bench-$NODAL_JOB_ID)");
  try {
    app.parse(argc, argv);
    cb::finish_options(options, text);
  } catch (const CLI::ParseError& e) {
    return cb::exit_for(app, e);
  }
  const int rank = env_int({"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"});
  const int world_size = env_int({"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"});
  if (rank < 0 || world_size < 1 || rank >= world_size) {
    std::fprintf(stderr, "gloo_bench: set RANK and WORLD_SIZE (nodalrun does)\n");
    return 2;
  }
  if (store_dir.empty()) {
    const char* job = std::getenv("NODAL_JOB_ID");
    if (!job) {
      std::fprintf(stderr, "gloo_bench: no NODAL_JOB_ID to name the rendezvous directory: give --store-dir\n");
      return 2;
    }
    const char* tmp = std::getenv("TMPDIR");
    store_dir = std::string(tmp && *tmp ? tmp : "/tmp") + "/nodal-gloo-bench-" + job;
  }
  try {
    GlooBackend backend(rank, world_size, store_dir);
    cb::run_benchmark(backend, options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gloo_bench: rank %d: %s\n", rank, e.what());
    return 1;
  }
  return 0;
}
