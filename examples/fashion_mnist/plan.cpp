#include "plan.hpp"

#include <numeric>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "random.hpp"

namespace fashion_mnist {
namespace {
constexpr std::uint64_t kShufflePurpose = 1;
}  // namespace

Plan make_plan(const Options& options, std::int64_t data_size, int trainers) {
  Plan plan;
  plan.train_size = options.train_subset > 0 ? std::min(options.train_subset, data_size) : data_size;
  plan.global_batch = options.global_batch;
  plan.shards = options.shards;
  plan.shard_size = options.global_batch / options.shards;
  plan.epochs = options.epochs;
  plan.seed = options.seed;
  plan.trainers = trainers;
  // The shard gradients are summed in a balanced binary tree whose subtrees are the trainers'
  // (trainer.hpp): both counts must be powers of two.
  auto power_of_two = [](int n) { return n > 0 && (n & (n - 1)) == 0; };
  if (!power_of_two(options.shards)) {
    throw std::invalid_argument(fmt::format("--shards {} is not a power of two", options.shards));
  }
  if (!power_of_two(trainers) || options.shards % trainers != 0) {
    std::vector<int> fitting;
    for (int n = 1; n <= options.shards; n *= 2) fitting.push_back(n);
    throw std::invalid_argument(fmt::format(
        "{} trainer rank(s) cannot share {} shards: the trainer count must be a power of two that divides --shards "
        "(the shards are summed in one fixed order, which keeps the weights the same for any trainer count); with "
        "--shards {} run {} trainer(s)",
        trainers, options.shards, options.shards, fmt::join(fitting, ", ")));
  }
  if (plan.global_batch > plan.train_size) {
    throw std::invalid_argument(
        fmt::format("--global-batch {} is larger than the {} training samples", plan.global_batch, plan.train_size));
  }
  plan.steps_per_epoch = plan.train_size / plan.global_batch;
  return plan;
}

std::vector<std::int32_t> epoch_order(const Plan& plan, int epoch) {
  std::vector<std::int32_t> order(static_cast<std::size_t>(plan.train_size));
  std::iota(order.begin(), order.end(), 0);
  SplitMix64 random(plan.seed, kShufflePurpose, static_cast<std::uint64_t>(epoch));
  for (std::size_t i = order.size() - 1; i > 0; --i) std::swap(order[i], order[random.below(i + 1)]);
  return order;
}

std::span<const std::int32_t> trainer_samples(const Plan& plan, const std::vector<std::int32_t>& order,
                                              std::int64_t step, int trainer) {
  const std::int64_t begin =
      step * plan.global_batch + static_cast<std::int64_t>(plan.first_shard(trainer)) * plan.shard_size;
  return std::span<const std::int32_t>(order).subspan(static_cast<std::size_t>(begin),
                                                      static_cast<std::size_t>(plan.local_batch()));
}

TrainerSampler::TrainerSampler(const Plan& plan, int trainer, std::int64_t first_step)
    : plan_(plan), trainer_(trainer), first_step_(first_step) {}

std::vector<std::int64_t> TrainerSampler::indices(std::int64_t epoch) const {
  const std::vector<std::int32_t> order = epoch_order(plan_, static_cast<int>(epoch));
  std::vector<std::int64_t> out;
  out.reserve(static_cast<std::size_t>(size()));
  for (std::int64_t step = 0; step < plan_.steps_per_epoch; ++step) {
    if (epoch * plan_.steps_per_epoch + step < first_step_) continue;  // trained before the checkpoint
    const std::span<const std::int32_t> samples = trainer_samples(plan_, order, step, trainer_);
    out.insert(out.end(), samples.begin(), samples.end());
  }
  return out;
}

std::int64_t TrainerSampler::size() const { return plan_.steps_per_epoch * plan_.local_batch(); }

}  // namespace fashion_mnist
