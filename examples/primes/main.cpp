// A small real job for nodalrun: count the primes below a bound, each rank sieving its own
// segment of the range (segmented sieve of Eratosthenes), and check the total against the known
// value of pi(x) when x is a power of ten.
//
//   nodalrun -n 2 build/release/examples/primes/primes 100000000
//
// Until the collectives exist the ranks combine their counts in a process-shared Value and meet
// at a Barrier, both in the job's shared arena; rank 0 prints and checks the total.
#include <nodal/nodal.hpp>
#include <nodal/sync.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <vector>

#include <fmt/format.h>

namespace {

/// Primes up to sqrt(limit), by a plain sieve.
std::vector<std::uint64_t> base_primes(std::uint64_t limit) {
  auto root = static_cast<std::uint64_t>(std::sqrt(static_cast<double>(limit))) + 1;
  std::vector<bool> composite(root + 1, false);
  std::vector<std::uint64_t> primes;
  for (std::uint64_t i = 2; i <= root; ++i) {
    if (composite[i]) continue;
    primes.push_back(i);
    for (std::uint64_t j = i * i; j <= root; j += i) composite[j] = true;
  }
  return primes;
}

/// Primes in [lo, hi).
std::uint64_t count_segment(std::uint64_t lo, std::uint64_t hi, const std::vector<std::uint64_t>& primes) {
  std::uint64_t count = 0;
  constexpr std::uint64_t kBlock = 1 << 18;
  std::vector<char> composite(kBlock);
  for (std::uint64_t start = lo; start < hi; start += kBlock) {
    std::uint64_t end = std::min(start + kBlock, hi);
    std::fill(composite.begin(), composite.end(), 0);
    for (std::uint64_t p : primes) {
      if (p * p >= end) break;
      std::uint64_t first = std::max(p * p, (start + p - 1) / p * p);
      for (std::uint64_t m = first; m < end; m += p) composite[m - start] = 1;
    }
    for (std::uint64_t n = std::max<std::uint64_t>(start, 2); n < end; ++n) count += !composite[n - start];
  }
  return count;
}

}  // namespace

int main(int argc, char** argv) {
  nodal::Context ctx = nodal::init();
  std::uint64_t limit = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 100'000'000ULL;
  auto t0 = std::chrono::steady_clock::now();

  std::vector<std::uint64_t> primes = base_primes(limit);
  std::uint64_t per_rank = (limit + ctx.world_size() - 1) / ctx.world_size();
  std::uint64_t lo = per_rank * ctx.rank();
  std::uint64_t hi = std::min(limit, lo + per_rank);
  std::uint64_t count = lo < hi ? count_segment(lo, hi, primes) : 0;
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("rank {}/{}: {} primes in [{}, {}) in {:.2f} s\n", ctx.rank(), ctx.world_size(), count, lo, hi, seconds);

  nodal::Value<std::uint64_t> total = nodal::Value<std::uint64_t>::open("primes.total", 0);
  nodal::Barrier all_counted = nodal::Barrier::open("primes.counted", ctx.world_size());
  total.update([count](std::uint64_t& sum) { sum += count; });
  all_counted.wait();
  if (ctx.rank() != 0) return 0;

  static const std::map<std::uint64_t, std::uint64_t> known = {
      {10, 4}, {100, 25}, {1000, 168}, {10000, 1229}, {100000, 9592}, {1000000, 78498},
      {10000000, 664579}, {100000000, 5761455}, {1000000000, 50847534}};
  const std::uint64_t sum = total.get();
  fmt::print("pi({}) = {} over {} ranks\n", limit, sum, ctx.world_size());
  if (auto it = known.find(limit); it != known.end() && it->second != sum) {
    fmt::print(stderr, "wrong answer: pi({}) is {}\n", limit, it->second);
    return 1;
  }
  return 0;
}
