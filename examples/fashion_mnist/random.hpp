// The job's one random number generator: SplitMix64 (Steele, Lea, Flood, "Fast splittable
// pseudorandom number generators", OOPSLA 2014). Written out rather than taken from <random>
// because the standard fixes mt19937's output but not what its distributions or std::shuffle
// make of it: the weights and the batch order must not depend on the standard library.
#pragma once

#include <cstdint>

namespace fashion_mnist {

class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
  /// A stream per (seed, purpose, index), e.g. one per epoch: distinct seeds, mixed once more.
  SplitMix64(std::uint64_t seed, std::uint64_t purpose, std::uint64_t index)
      : state_(mix(seed ^ mix(purpose * 0x9e3779b97f4a7c15ULL + index))) {}

  std::uint64_t next() { return mix(state_ += 0x9e3779b97f4a7c15ULL); }
  /// Uniform in [0, bound): the modulo's bias is below bound / 2^64 (3e-15 for 60000), which no
  /// shuffle here can show.
  std::uint64_t below(std::uint64_t bound) { return next() % bound; }
  /// Uniform in [0, 1) with 24 random bits: every value is a float exactly.
  float uniform() { return static_cast<float>(next() >> 40) * 0x1.0p-24F; }

 private:
  static std::uint64_t mix(std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  std::uint64_t state_;
};

}  // namespace fashion_mnist
