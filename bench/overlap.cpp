// nodal-overlap: what the non-blocking collectives buy a data-parallel step. Each step has B
// gradient buckets; the "backward" computes bucket k (a compute-bound loop over a small private
// array, --compute-us long) and then hands bucket k to allreduce. Blocking: compute k, allreduce k,
// compute k+1, ... Non-blocking: compute k, iallreduce k, compute k+1 while k reduces on the
// communicator's progress thread, ..., then wait for all (DDP's bucketed overlap). Prints, per
// mode, the median step time over --steps steps (after --warmup), and the compute-only and
// communication-only step times measured the same way, as CSV:
//   mode,ranks,buckets,bucket_bytes,compute_us,step_ms_median
// Run under nodalrun: nodalrun -n 2 build/release/bench/nodal-overlap
#include <nodal/communicator.hpp>
#include <nodal/nodal.hpp>
#include <nodal/detail/units.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int buckets = 8;
  std::string bucket_bytes = "4MiB";
  double compute_us = 2000;
  int steps = 15;
  int warmup = 3;
};

/// A compute-bound loop (stays in L1: no memory traffic to compete with the copies) of about
/// `us` microseconds, calibrated once.
class Compute {
 public:
  explicit Compute(double us) {
    const auto start = Clock::now();
    spin(1 << 20);
    const double per_iteration = std::chrono::duration<double, std::micro>(Clock::now() - start).count() / (1 << 20);
    iterations_ = static_cast<std::int64_t>(us / per_iteration);
  }
  void run() { spin(iterations_); }
  float sink() const { return state_[0]; }

 private:
  void spin(std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i) {
      float& x = state_[static_cast<std::size_t>(i) & 255];
      x = x * 0.9999999F + 0.5F;
    }
  }
  std::int64_t iterations_ = 0;
  float state_[256] = {};
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"nodal-overlap: blocking vs non-blocking allreduce of gradient buckets beside compute"};
  app.add_option("--buckets", o.buckets, "buckets per step")->check(CLI::PositiveNumber);
  app.add_option("--bucket-bytes", o.bucket_bytes, "bytes per bucket (f32)");
  app.add_option("--compute-us", o.compute_us, "compute per bucket, microseconds")->check(CLI::NonNegativeNumber);
  app.add_option("--steps", o.steps, "timed steps per mode")->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup, "untimed steps per mode")->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);

  nodal::Context ctx = nodal::init();
  nodal::Communicator comm = ctx.world();
  const std::int64_t count = static_cast<std::int64_t>(nodal::detail::parse_bytes(o.bucket_bytes) / 4);
  std::vector<nodal::Tensor> buckets;
  for (int k = 0; k < o.buckets; ++k) buckets.push_back(nodal::Tensor::zeros({count}, nodal::DType::f32));
  Compute compute(o.compute_us);

  auto time_steps = [&](auto&& step) {
    std::vector<double> ms;
    for (int s = 0; s < o.warmup + o.steps; ++s) {
      comm.barrier();
      const auto start = Clock::now();
      step();
      comm.barrier();  // the step ends when the slowest rank's does
      if (s >= o.warmup) ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    }
    return median(ms);
  };
  const double compute_only = time_steps([&] {
    for (int k = 0; k < o.buckets; ++k) compute.run();
  });
  const double comm_only = time_steps([&] {
    for (auto& b : buckets) comm.allreduce(b);
  });
  const double blocking = time_steps([&] {
    for (auto& b : buckets) {
      compute.run();
      comm.allreduce(b);
    }
  });
  const double overlapped = time_steps([&] {
    std::vector<nodal::Work> works;
    for (auto& b : buckets) {
      compute.run();
      works.push_back(comm.iallreduce(b));
    }
    for (auto& w : works) w.wait();
  });
  // The cost of the queue itself: one 4-byte allreduce per call, waited for at once, on a fresh
  // communicator (its blocking calls run inline) and on this one (they queue too, now).
  nodal::Communicator fresh = comm.split(0, ctx.rank());
  nodal::Tensor one = nodal::Tensor::zeros({1}, nodal::DType::f32);
  auto per_call_us = [&](auto&& call) {
    std::vector<double> us;
    for (int s = 0; s < 5; ++s) {
      comm.barrier();
      const auto start = Clock::now();
      for (int i = 0; i < 2000; ++i) call();
      us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count() / 2000);
    }
    return median(us);
  };
  const double small_inline = per_call_us([&] { fresh.allreduce(one); });
  const double small_queued = per_call_us([&] { comm.allreduce(one); });
  const double small_nonblocking = per_call_us([&] { comm.iallreduce(one).wait(); });
  if (ctx.rank() == 0) {
    std::printf("# 4-byte allreduce per call: blocking %.2f us, blocking behind a progress thread %.2f us, "
                "iallreduce+wait %.2f us\n",
                small_inline, small_queued, small_nonblocking);
    std::printf("mode,ranks,buckets,bucket_bytes,compute_us,step_ms_median\n");
    const std::string common = std::to_string(comm.world_size()) + "," + std::to_string(o.buckets) + "," +
                               std::to_string(count * 4) + "," + std::to_string(o.compute_us);
    for (auto [mode, ms] : {std::pair{"compute_only", compute_only}, {"allreduce_only", comm_only},
                            {"blocking", blocking}, {"nonblocking", overlapped}}) {
      std::printf("%s,%s,%.3f\n", mode, common.c_str(), ms);
    }
    std::printf("# nonblocking / blocking = %.3f; ideal (max of the two parts) / blocking = %.3f (sink %g)\n",
                overlapped / blocking, std::max(compute_only, comm_only) / blocking, static_cast<double>(compute.sink()));
  }
  return 0;
}
