// Rank program of tests/unit/finalize_test.cpp: nodal::finalize() and its hooks
// (detail/finalize.hpp), on the CPU path.
//   finalize_program at_exit    hooks registered, a static object made, then the atexit handler
//                               registered (as the GPU layer does after CUDA starts); main returns
//                               without finalize(): the hooks must run before the static's
//                               destructor
//   finalize_program explicit   finalize() runs the hooks once, in reverse order, a failing hook
//                               does not stop the others; afterwards a call on cuda tensors is a
//                               UsageError and CPU collectives still work
#include <nodal/communicator.hpp>
#include <nodal/nodal.hpp>
#include <nodal/detail/finalize.hpp>

#include <cstdio>
#include <stdexcept>
#include <string>

namespace {

struct Announces {
  ~Announces() { std::printf("static destructor\n"); }
};

int at_exit_mode() {
  nodal::detail::at_finalize([] { std::printf("hook 1\n"); });
  nodal::detail::at_finalize([] { std::printf("hook 2\n"); });
  static Announces constructed_before;  // like the world communicator's state: made before CUDA starts
  nodal::detail::finalize_at_exit();
  nodal::detail::finalize_at_exit();  // a second registration must not run the hooks twice
  std::printf("main returns\n");
  return 0;
}

int explicit_mode(const nodal::Context& ctx) {
  nodal::Communicator world = ctx.world();
  nodal::detail::at_finalize([] { std::printf("hook 1\n"); });
  nodal::detail::at_finalize([] { throw std::runtime_error("hook 2 fails"); });
  nodal::detail::at_finalize([] { std::printf("hook 3\n"); });
  std::printf("finalized before: %d\n", nodal::detail::finalized() ? 1 : 0);
  nodal::finalize();
  nodal::finalize();
  std::printf("finalized after: %d\n", nodal::detail::finalized() ? 1 : 0);
  nodal::detail::at_finalize([] { std::printf("late hook runs at once\n"); });
  try {
    world.barrier(nodal::Device::cuda(0));
    std::printf("cuda barrier after finalize: no error\n");
  } catch (const nodal::UsageError& e) {
    std::printf("cuda barrier after finalize: UsageError: %s\n", e.what());
  }
  int value = ctx.rank() + 1;
  int sum = 0;
  world.allreduce(&value, &sum, 1, nodal::DType::i32, nodal::ReduceOp::sum);
  std::printf("cpu allreduce after finalize: %d\n", sum);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const std::string mode = argc > 1 ? argv[1] : "";
  nodal::Context ctx = nodal::init();
  if (mode == "at_exit") return at_exit_mode();
  if (mode == "explicit") return explicit_mode(ctx);
  std::fprintf(stderr, "finalize_program: unknown mode '%s'\n", mode.c_str());
  return 64;
}
