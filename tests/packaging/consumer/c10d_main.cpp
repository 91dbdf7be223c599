// A libtorch program outside nodal's tree: links nodal::c10d from the installed package, makes the
// process group and reduces through it.
#include <nodal/context.hpp>
#include <nodal/torch/process_group_nodal.hpp>

#include <ATen/ATen.h>

#include <cstdio>
#include <vector>

int main() {
  const nodal::Context ctx = nodal::init();
  auto pg = nodal::torch_backend::ProcessGroupNodal::create(ctx.rank(), ctx.world_size(), {});
  std::vector<at::Tensor> tensors{at::full({4}, ctx.rank() + 1, at::kInt)};
  pg->allreduce(tensors)->wait();
  const int sum = tensors[0][0].item<int>();
  std::printf("consumer_c10d rank %d of %d sum %d\n", ctx.rank(), ctx.world_size(), sum);
  return sum == ctx.world_size() * (ctx.world_size() + 1) / 2 ? 0 : 1;
}
