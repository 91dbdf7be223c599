#include <nodal/nodal.hpp>

#include <cstdio>

int main() {
  nodal::Context ctx = nodal::init();
  std::printf("consumer rank %d of %d\n", ctx.rank(), ctx.world_size());
  return ctx.world_size() >= 1 ? 0 : 1;
}
