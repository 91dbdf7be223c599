#include <nodal/nodal.hpp>

#include <cstdio>

int main() {
  nodal::Context ctx = nodal::init();
  // The umbrella header brings the Communicator when nodal::collectives is linked.
  nodal::Communicator world = ctx.world();
  int value = ctx.rank() + 1;
  world.allreduce(&value, &value, 1, nodal::DType::i32, nodal::ReduceOp::sum);
  std::printf("consumer rank %d of %d sum %d\n", ctx.rank(), ctx.world_size(), value);
  return value == ctx.world_size() * (ctx.world_size() + 1) / 2 ? 0 : 1;
}
