// libtorch without Python: a C++ rank program that makes ProcessGroupNodal itself and calls it the
// way libtorch users do (pg->allreduce(tensors)->wait()), checking every result and the Work's
// future (what DDP reads). Run by tests/integration/torch_backend_test.cpp under nodalrun -n N;
// prints "libtorch ok: C checks" and exits 0, or "FAIL ..." and exits 1.
#include <nodal/context.hpp>
#include <nodal/torch/arena_tensor.hpp>
#include <nodal/torch/process_group_nodal.hpp>

#include <ATen/ATen.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

int g_checks = 0;
int g_rank = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    std::printf("FAIL rank %d: %s\n", g_rank, what.c_str());
    std::fflush(stdout);
    std::exit(1);
  }
  ++g_checks;
}

}  // namespace

int main() {
  using nodal::torch_backend::ProcessGroupNodal;
  const nodal::Context ctx = nodal::init();
  const int r = ctx.rank(), n = ctx.world_size();
  g_rank = r;
  auto pg = ProcessGroupNodal::create(r, n, {});
  check(pg->getRank() == r && pg->getSize() == n && pg->getBackendName() == "nodal", "rank, size, name");

  // allreduce: the result in place, and the finished Work's future holds the same tensor.
  std::vector<at::Tensor> grads{at::full({1000}, static_cast<double>(r + 1), at::kFloat)};
  auto work = pg->allreduce(grads);
  check(work->wait(), "allreduce wait");
  check(work->isCompleted() && work->isSuccess(), "allreduce work completed");
  check(at::equal(grads[0], at::full({1000}, n * (n + 1) / 2.0, at::kFloat)), "allreduce sum");
  auto future = work->getFuture();
  check(future->completed() && future->value().toTensorVector()[0].is_same(grads[0]), "the future holds the bucket");

  // MAX over int64, broadcast from the last rank, allgather into one tensor, reduce_scatter.
  std::vector<at::Tensor> v{at::arange(5, at::kLong) * (r + 1)};
  c10d::AllreduceOptions max;
  max.reduceOp = c10d::ReduceOp::MAX;
  pg->allreduce(v, max)->wait();
  check(at::equal(v[0], at::arange(5, at::kLong) * n), "allreduce max");
  std::vector<at::Tensor> b{r == n - 1 ? at::arange(7, at::kDouble) : at::zeros({7}, at::kDouble)};
  c10d::BroadcastOptions from_last;
  from_last.rootRank = n - 1;
  pg->broadcast(b, from_last)->wait();
  check(at::equal(b[0], at::arange(7, at::kDouble)), "broadcast from the last rank");
  at::Tensor mine = at::full({3}, r, at::kInt), all = at::empty({3 * n}, at::kInt);
  pg->_allgather_base(all, mine)->wait();
  for (int j = 0; j < n; ++j) check(at::equal(all.narrow(0, 3 * j, 3), at::full({3}, j, at::kInt)), "allgather block");
  at::Tensor input = at::ones({4 * n}, at::kFloat), block = at::empty({4}, at::kFloat);
  pg->_reduce_scatter_base(block, input)->wait();
  check(at::equal(block, at::full({4}, static_cast<double>(n), at::kFloat)), "reduce_scatter");

  // A tensor in the arena (the in_place path), then a barrier.
  at::Tensor shared = nodal::torch_backend::empty_shared({1 << 20}, at::kFloat);
  shared.fill_(1.0);
  std::vector<at::Tensor> s{shared};
  pg->allreduce(s)->wait();
  check(at::equal(shared, at::full({1 << 20}, static_cast<double>(n), at::kFloat)), "arena allreduce");
  check(pg->communicator().last_algorithm() == "in_place" || n == 1 || pg->communicator().last_algorithm() == "small",
        "arena allreduce took " + pg->communicator().last_algorithm());
  pg->barrier()->wait();

  // A group of the job's ranks in reverse order, made by its members alone (all of them here).
  std::vector<std::int64_t> reversed;
  for (int j = n - 1; j >= 0; --j) reversed.push_back(j);
  auto group = ProcessGroupNodal::create(n - 1 - r, n, reversed, "reversed");
  check(group->getRank() == n - 1 - r, "group rank");
  std::vector<at::Tensor> g{at::full({2}, r, at::kLong)};
  c10d::BroadcastOptions group_root;  // group rank 0 is job rank n - 1
  pg->barrier()->wait();
  group->broadcast(g, group_root)->wait();
  check(at::equal(g[0], at::full({2}, n - 1, at::kLong)), "broadcast from group rank 0");

  // A bad call: c10::Error naming it.
  try {
    c10d::AllreduceOptions band;
    band.reduceOp = c10d::ReduceOp::BAND;
    pg->allreduce(v, band);
    check(false, "BAND accepted");
  } catch (const c10::Error& e) {
    check(std::string(e.what()).find("BAND") != std::string::npos, std::string("BAND refusal: ") + e.what());
  }
  std::printf("libtorch ok: %d checks\n", g_checks);
  return 0;
}
