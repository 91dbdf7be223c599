// torch.utils.data's samplers: the order in which a map-style dataset's indices are visited.
#pragma once

#include <cstdint>
#include <vector>

namespace nodal::data {

class Sampler {
 public:
  virtual ~Sampler() = default;
  /// The indices of one epoch, in order. The same epoch gives the same indices. An epoch may
  /// have fewer than size() (a sampler that resumes in the middle of one, say): the DataLoader
  /// makes the batches of the indices it gets.
  virtual std::vector<std::int64_t> indices(std::int64_t epoch) const = 0;
  /// How many indices a whole epoch has (DataLoader::size() counts batches from it).
  virtual std::int64_t size() const = 0;
};

/// 0, 1, ..., size-1 (torch's SequentialSampler).
class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(std::int64_t size) : size_(size) {}
  std::vector<std::int64_t> indices(std::int64_t epoch) const override;
  std::int64_t size() const override { return size_; }

 private:
  std::int64_t size_;
};

/// A permutation of 0..size-1 drawn from seed + epoch (torch's RandomSampler with a generator
/// seeded per epoch): the same on every run and process, another each epoch.
class RandomSampler : public Sampler {
 public:
  RandomSampler(std::int64_t size, std::uint64_t seed) : size_(size), seed_(seed) {}
  std::vector<std::int64_t> indices(std::int64_t epoch) const override;
  std::int64_t size() const override { return size_; }

 private:
  std::int64_t size_;
  std::uint64_t seed_;
};

struct DistributedSamplerOptions {
  int rank = 0;
  int world_size = 1;
  bool shuffle = true;
  std::uint64_t seed = 0;
  bool drop_last = false;
};

/// This rank's share of 0..size-1 (torch's DistributedSampler): the epoch's permutation (seed +
/// epoch, the same on every rank; or 0..size-1 without shuffle), padded by repeating its start to
/// a multiple of world_size (or, with drop_last, cut to one), then every world_size-th index from
/// `rank`. Every rank gets the same count: ceil(size / world) (floor with drop_last).
/// Throws UsageError for a rank outside 0..world_size-1.
class DistributedSampler : public Sampler {
 public:
  DistributedSampler(std::int64_t size, DistributedSamplerOptions options);
  std::vector<std::int64_t> indices(std::int64_t epoch) const override;
  /// Indices per epoch on each rank.
  std::int64_t size() const override { return per_rank_; }

 private:
  std::int64_t size_;
  DistributedSamplerOptions options_;
  std::int64_t per_rank_;
};

}  // namespace nodal::data
