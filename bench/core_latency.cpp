// core-latency: the one-way latency of a cache line between two CPUs, the floor under every small
// collective (a 2-rank allreduce of 4 bytes moves one line each way per call).
//
//   build/release/bench/core-latency --cpus 0,1 --round-trips 200000
//
// Two processes pinned to the two CPUs pass a counter back and forth through one shared cache
// line each way (ping-pong, waiting with `pause` as nodal's ranks do); after 10000 untimed round
// trips prints one line: "one-way latency: X us" (half a round trip, the mean over --round-trips).
// Exits 1, saying why, when either CPU cannot be used. On this project's VM
// the figure switches between ~0.05 us and ~0.2 us as the host moves the VM's CPUs (apart for
// seconds at a time): small-message results taken in the two states differ by up to 2x, so
// bench/results label runs by it (e.g. 2026-11-28-small-call-path.md). --quiet prints the number alone.
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <new>
#include <string>
#include <vector>

#include <nodal/detail/wait.hpp>

#include <CLI/CLI.hpp>

namespace {

struct alignas(64) Line {
  std::atomic<long> value{0};
};

/// Round trips before the timed ones: both processes pinned, the lines in their caches.
constexpr long kWarmUp = 10000;

bool pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (::sched_setaffinity(0, sizeof set, &set) == 0) return true;
  std::perror("core-latency: sched_setaffinity");
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"core-latency: one-way latency of a cache line between two CPUs (ping-pong of two processes)"};
  std::vector<int> cpus{0, 1};
  long round_trips = 200000;
  bool quiet = false;
  app.add_option("--cpus", cpus, "the two CPUs, comma-separated")->delimiter(',')->expected(2);
  app.add_option("--round-trips", round_trips, "round trips to time")->check(CLI::PositiveNumber);
  app.add_flag("--quiet", quiet, "print the figure (us) alone");
  CLI11_PARSE(app, argc, argv);

  void* page = ::mmap(nullptr, 2 * sizeof(Line), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) {
    std::perror("core-latency: mmap");
    return 1;
  }
  // [0]: ping, [1]: pong (the child's answer; -1: it could not pin itself and has exited).
  auto* lines = new (page) Line[2];
  const long total = kWarmUp + round_trips;
  const pid_t parent = ::getpid();
  const pid_t child = ::fork();
  if (child < 0) {
    std::perror("core-latency: fork");
    return 1;
  }
  if (child == 0) {
    // Never outlive the parent (it may fail after the fork): a spinning orphan would take a core.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent || !pin(cpus[1])) {
      lines[1].value.store(-1, std::memory_order_release);
      ::_exit(1);
    }
    for (long i = 1; i <= total; ++i) {
      while (lines[0].value.load(std::memory_order_acquire) != i) nodal::detail::cpu_relax();
      lines[1].value.store(i, std::memory_order_release);
    }
    ::_exit(0);
  }
  if (!pin(cpus[0])) {
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
    return 1;
  }
  auto start = std::chrono::steady_clock::now();
  for (long i = 1; i <= total; ++i) {
    if (i == kWarmUp + 1) start = std::chrono::steady_clock::now();
    lines[0].value.store(i, std::memory_order_release);
    for (long seen; (seen = lines[1].value.load(std::memory_order_acquire)) != i;) {
      if (seen < 0) {
        std::fprintf(stderr, "core-latency: the second process could not run on CPU %d\n", cpus[1]);
        ::waitpid(child, nullptr, 0);
        return 1;
      }
      nodal::detail::cpu_relax();
    }
  }
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  ::waitpid(child, nullptr, 0);
  const double one_way = us / static_cast<double>(round_trips) / 2;
  if (quiet) {
    std::printf("%.3f\n", one_way);
  } else {
    std::printf("one-way latency: %.3f us (CPUs %d and %d, %ld round trips)\n", one_way, cpus[0], cpus[1], round_trips);
  }
  return 0;
}
