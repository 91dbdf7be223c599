#include <nodal/data/sampler.hpp>

#include <nodal/errors.hpp>

#include <numeric>
#include <random>

#include <fmt/format.h>

namespace nodal::data {
namespace {

std::vector<std::int64_t> iota(std::int64_t size) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(std::max<std::int64_t>(size, 0)));
  std::iota(v.begin(), v.end(), std::int64_t{0});
  return v;
}

/// 0..size-1 shuffled by Fisher-Yates with mt19937_64 seeded `seed`: both fully specified, so the
/// order is the same with any standard library (std::shuffle's and uniform_int_distribution's
/// are not). The draw in [0, i) is a 64-bit draw modulo i: bias below i / 2^64.
std::vector<std::int64_t> permutation(std::int64_t size, std::uint64_t seed) {
  std::vector<std::int64_t> v = iota(size);
  std::mt19937_64 rng(seed);
  for (std::size_t i = v.size(); i > 1; --i) {
    const auto j = static_cast<std::size_t>(rng() % i);
    std::swap(v[i - 1], v[j]);
  }
  return v;
}

}  // namespace

std::vector<std::int64_t> SequentialSampler::indices(std::int64_t) const { return iota(size_); }

std::vector<std::int64_t> RandomSampler::indices(std::int64_t epoch) const {
  return permutation(size_, seed_ + static_cast<std::uint64_t>(epoch));
}

DistributedSampler::DistributedSampler(std::int64_t size, DistributedSamplerOptions options)
    : size_(size), options_(options) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    throw UsageError(fmt::format("DistributedSampler: rank {} is not in 0..world_size-1 (world_size {})",
                                 options.rank, options.world_size));
  }
  const std::int64_t world = options.world_size;
  // torch: with drop_last and a remainder, ceil((size - world) / world); else ceil(size / world).
  per_rank_ = options.drop_last && size % world != 0 ? (size - world + world - 1) / world : (size + world - 1) / world;
  per_rank_ = std::max<std::int64_t>(per_rank_, 0);
}

std::vector<std::int64_t> DistributedSampler::indices(std::int64_t epoch) const {
  std::vector<std::int64_t> all =
      options_.shuffle ? permutation(size_, options_.seed + static_cast<std::uint64_t>(epoch)) : iota(size_);
  const std::int64_t world = options_.world_size;
  const auto total = static_cast<std::size_t>(per_rank_ * world);
  if (all.size() < total && !all.empty()) {
    // Pad by repeating the start (as often as needed when the padding exceeds the size).
    const std::size_t original = all.size();
    for (std::size_t k = 0; all.size() < total; ++k) all.push_back(all[k % original]);
  }
  all.resize(total);
  std::vector<std::int64_t> mine;
  mine.reserve(static_cast<std::size_t>(per_rank_));
  for (std::size_t k = static_cast<std::size_t>(options_.rank); k < total; k += static_cast<std::size_t>(world)) {
    mine.push_back(all[k]);
  }
  return mine;
}

}  // namespace nodal::data
