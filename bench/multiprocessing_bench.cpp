// torch.multiprocessing's surface in nodal, timed: Process start+join of an empty function (fork
// and forkserver), Pipe round trips of 8 bytes and of a shared 64 MiB tensor between this process
// and a fork()ed child. Its peer, run beside it by
// bench/multiprocessing.sh, is bench/peers/mp_bench.py (Python's multiprocessing and
// torch.multiprocessing). One line per figure: name,median_us,min_us,max_us,rounds.
#include <nodal/errors.hpp>
#include <nodal/pipe.hpp>
#include <nodal/process.hpp>
#include <nodal/spawn.hpp>
#include <nodal/tensor.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
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

}  // namespace

int main() {
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
  return 0;
}
