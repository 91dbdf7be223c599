// torch.multiprocessing's surface in nodal, timed: Process start+join of an empty function (fork
// and forkserver), Pipe round trips of 8 bytes and of a shared 64 MiB tensor between this process
// and a fork()ed child, Pool.map's cost per task (10k tasks of an identity, chunksize 1, 2
// workers) and Pool.map of 1000 tasks each returning a new 1 MiB tensor (2 workers). Its peer, run beside it by
// bench/multiprocessing.sh, is bench/peers/mp_bench.py (Python's multiprocessing and
// torch.multiprocessing). One line per figure: name,median_us,min_us,max_us,rounds.
#include <nodal/errors.hpp>
#include <nodal/pipe.hpp>
#include <nodal/pool.hpp>
#include <nodal/process.hpp>
#include <nodal/spawn.hpp>
#include <nodal/tensor.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace {

using Clock = std::chrono::steady_clock;

void report(const std::string& name, std::vector<double> us) {
  std::sort(us.begin(), us.end());
  fmt::print("{},{:.3f},{:.3f},{:.3f},{}\n", name, us[us.size() / 2], us.front(), us.back(), us.size());
}

/// Medians over `rounds` batches of `per_round` round trips each.
template <class Trip>
std::vector<double> time_round_trips(int rounds, int per_round, Trip&& trip) {
  std::vector<double> us;
  for (int r = 0; r < rounds; ++r) {
    const auto start = Clock::now();
    for (int i = 0; i < per_round; ++i) trip();
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count() / per_round);
  }
  return us;
}

void empty() {}

std::int64_t identity(std::int64_t x) { return x; }

/// A new 1 MiB tensor made in the arena (where a result travels by handle): left as it is
/// (torch.empty's peer), or filled with zeros (torch.zeros's: 1 MiB written, ~100 us here).
nodal::Tensor new_mebibyte_empty(std::int64_t) { return nodal::Tensor::empty_shared({1 << 20}, nodal::DType::u8); }
nodal::Tensor new_mebibyte_zeros(std::int64_t) {
  nodal::Tensor t = nodal::Tensor::empty_shared({1 << 20}, nodal::DType::u8);
  std::memset(t.data(), 0, 1 << 20);
  return t;
}

std::vector<std::int64_t> iota(std::int64_t n) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = i;
  return v;
}

}  // namespace

int main() {
  // 1000 results of 1 MiB live at once (as in the peer's list of tensors): room for them.
  ::setenv("NODAL_SHM_SIZE", "3G", 0);
  // First, while this process runs one thread: the fork server starts from a clean copy.
  nodal::start_forkserver();
  for (auto [name, method] : {std::pair{"process_start_join_fork", nodal::StartMethod::fork},
                              std::pair{"process_start_join_forkserver", nodal::StartMethod::forkserver}}) {
    report(name, time_round_trips(15, 20, [method = method] {
             nodal::Process p(&empty, {.start_method = method});
             p.start();
             p.join();
           }));
  }
  constexpr int kRounds = 15;
  constexpr int kBytesTrips = 2000;
  constexpr int kTensorTrips = 200;
  auto [parent, child_end] = nodal::Pipe();
  nodal::Tensor big = nodal::Tensor::empty_shared({64 << 20}, nodal::DType::u8);
  const pid_t child = ::fork();
  if (child == 0) {
    // Echo: bytes back as bytes, tensors back as tensors, until the parent closes.
    try {
      for (;;) child_end.send_bytes(child_end.recv_bytes());
    } catch (const nodal::EndOfStream&) {
    }
    ::_exit(0);
  }
  const std::string eight(8, 'x');
  report("pipe_round_trip_8B", time_round_trips(kRounds, kBytesTrips, [&] {
           parent.send_bytes(eight);
           (void)parent.recv_bytes();
         }));
  parent.close();
  ::waitpid(child, nullptr, 0);

  auto [p2, c2] = nodal::Pipe();
  const pid_t tensor_child = ::fork();
  if (tensor_child == 0) {
    try {
      for (;;) c2.send_tensor(c2.recv_tensor());
    } catch (const nodal::EndOfStream&) {
    }
    ::_exit(0);
  }
  report("pipe_round_trip_shared_64MiB_tensor", time_round_trips(kRounds, kTensorTrips, [&] {
           p2.send_tensor(big);
           (void)p2.recv_tensor();
         }));
  p2.close();
  ::waitpid(tensor_child, nullptr, 0);

  nodal::Pool pool(2, {.start_method = nodal::StartMethod::fork});
  const std::vector<std::int64_t> tasks = iota(10000);
  (void)pool.map(&identity, tasks);  // warm-up
  std::vector<double> per_task = time_round_trips(9, 1, [&] { (void)pool.map(&identity, tasks, 1); });
  for (double& us : per_task) us /= static_cast<double>(tasks.size());
  report("pool_map_per_task_10k_chunksize1", per_task);
  const std::vector<std::int64_t> thousand = iota(1000);
  for (auto [name, fn] : {std::pair{"empty", &new_mebibyte_empty}, std::pair{"zeros", &new_mebibyte_zeros}}) {
    (void)pool.map(fn, thousand);  // warm-up: the arena's pages are reserved once
    report(fmt::format("pool_map_1000_tasks_new_1MiB_tensor_{}", name), time_round_trips(9, 1, [&, fn = fn] {
             const std::vector<nodal::Tensor> results = pool.map(fn, thousand);
             if (results.size() != 1000) std::abort();
           }));
  }
  return 0;
}
