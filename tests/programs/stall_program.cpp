// The rank program of the hang-diagnosis tests (tests/faults/stall_faults_test.cpp). MODE:
//   skip-allreduce   every rank makes 3 allreduces of 4 floats, but the last rank skips the third
//                    and returns: the others wait for it forever
//   idle-producer    rank 0 gets from queue 'jobs'; rank 1 puts 2 items, then stays alive, idle in
//                    its own code: the consumer waits for a put that never comes
//   mismatch         rank 0 calls allreduce, the others broadcast (a UsageError, not a stall)
//   hung-child       rank 0 joins a nodal::spawn child that never ends (a join is a wait too)
//   progress         every rank makes allreduces for SECONDS (argument 2), rank 0 sleeping
//                    between them in its own code: slow, but never a stall
// Each rank prints "ready <rank> <pid>" first.
#include <nodal/nodal.hpp>
#include <nodal/tensor_queue.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

int main(int argc, char** argv) {
  nodal::Context ctx = nodal::init();
  const std::string mode = argc > 1 ? argv[1] : "";
  std::printf("ready %d %d\n", ctx.rank(), static_cast<int>(::getpid()));
  std::fflush(stdout);
  nodal::Communicator world = ctx.world();
  const int last = ctx.world_size() - 1;
  if (mode == "skip-allreduce") {
    float x[4] = {1, 1, 1, 1};
    for (int i = 0; i < 3; ++i) {
      if (i == 2 && ctx.rank() == last) return 0;  // the bug: an early return
      world.allreduce(x, x, 4, nodal::DType::f32);
    }
    return 0;
  }
  if (mode == "idle-producer") {
    auto queue = nodal::TensorQueue::open("jobs", 4);
    if (ctx.rank() == 0) {
      while (queue.get()) {
      }
    } else if (ctx.rank() == 1) {
      for (int i = 0; i < 2; ++i) queue.put({nodal::Tensor::zeros({8}, nodal::DType::f32), i, 0, {}});
      std::this_thread::sleep_for(std::chrono::hours(1));  // alive, never puts again
    }
    return 0;
  }
  if (mode == "mismatch") {
    float x[4] = {1, 1, 1, 1};
    if (ctx.rank() == 0) {
      world.allreduce(x, x, 4, nodal::DType::f32);
    } else {
      world.broadcast(x, 4, nodal::DType::f32, 0);
    }
    return 0;
  }
  if (mode == "hung-child") {
    if (ctx.rank() == 0) {
      nodal::spawn([](int) { std::this_thread::sleep_for(std::chrono::hours(1)); }, 1,
                   {.start_method = nodal::StartMethod::fork});
    }
    return 0;
  }
  if (mode == "progress") {
    const double seconds = argc > 2 ? std::atof(argv[2]) : 3.0;
    float x[4] = {1, 1, 1, 1};
    // A count every rank agrees on (each rank reading its own clock could make one call more
    // than the other, and wait for a rank that has exited: a stall indeed).
    const int rounds = static_cast<int>(seconds / 0.3);
    for (int round = 0; round < rounds; ++round) {
      if (ctx.rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
      world.allreduce(x, x, 4, nodal::DType::f32);
    }
    return 0;
  }
  std::fprintf(stderr, "stall_program: unknown mode '%s'\n", mode.c_str());
  return 2;
}
