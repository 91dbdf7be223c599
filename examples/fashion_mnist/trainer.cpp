#include "trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numbers>

namespace fashion_mnist {
namespace {

using Clock = std::chrono::steady_clock;

/// Floats per shard row: the gradient, its loss at index kParameterCount, padding to 64 bytes so
/// that every row starts aligned like the first.
std::size_t row_floats() { return Mlp::kParameterCount + 16; }

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

/// Sums rows[0..n) into rows[0] in a balanced tree, ((r0 + r1) + (r2 + r3)) for four: the one
/// order every trainer count reproduces. n is a power of two; each row has `floats` floats.
void tree_sum(const std::vector<float*>& rows, std::size_t floats) {
  const auto n = static_cast<Eigen::Index>(floats);
  for (std::size_t width = 1; width < rows.size(); width *= 2) {
    for (std::size_t i = 0; i + width < rows.size(); i += 2 * width) {
      Eigen::Map<Eigen::ArrayXf>(rows[i], n) += Eigen::Map<const Eigen::ArrayXf>(rows[i + width], n);
    }
  }
}

}  // namespace

DataParallelTrainer::DataParallelTrainer(const Plan& plan, const Options& options, nodal::Communicator comm,
                                         nodal::Device device)
    : plan_(plan),
      learning_rate_(options.learning_rate),
      momentum_(options.momentum),
      comm_(std::move(comm)),
      device_(device),
      model_(options.seed) {
  const std::size_t stride = row_floats();
  const int mine = plan_.shards_per_trainer();
  local_rows_.assign(static_cast<std::size_t>(mine) * stride, 0.0F);
  for (int k = 0; k < mine; ++k) shard_rows_.push_back(local_rows_.data() + k * stride);
  if (plan_.trainers > 1) {
    pair_rows_ =
        nodal::Tensor::empty_shared({plan_.trainers / 2, static_cast<std::int64_t>(stride)}, nodal::DType::f32);
    std::fill_n(pair_rows_.data_ptr<float>(), pair_rows_.numel(), 0.0F);
    shard_rows_[0] = pair_rows_.data_ptr<float>() + (comm_.rank() / 2) * stride;
  }
}

float DataParallelTrainer::learning_rate(std::int64_t step) const {
  const double progress = static_cast<double>(step) / static_cast<double>(plan_.total_steps());
  return static_cast<float>(learning_rate_ * 0.5 * (1 + std::cos(std::numbers::pi * progress)));
}

float DataParallelTrainer::step(std::int64_t step, const nodal::data::Batch& batch, StepTimes& times) {
  const auto start = Clock::now();
  const std::size_t stride = row_floats();
  const float* images = batch["image"].data_ptr<float>();
  const std::int32_t* labels = batch["label"].data_ptr<std::int32_t>();
  for (std::size_t k = 0; k < shard_rows_.size(); ++k) {
    const std::size_t offset = k * plan_.shard_size;
    float* row = shard_rows_[k];
    row[Mlp::kParameterCount] =
        model_.shard_gradient(images + offset * Mlp::kInput, labels + offset, plan_.shard_size, row);
  }
  tree_sum(shard_rows_, stride);  // this trainer's subtree, into shard_rows_[0]
  float* sum = shard_rows_[0];
  auto resume = start;  // where the compute after the allreduce starts
  if (plan_.trainers > 1) {
    // Rows of other pairs hold last step's sums: zero them, so that only the pair's two terms count.
    float* rows = pair_rows_.data_ptr<float>();
    const int pair = comm_.rank() / 2;
    std::fill(rows, rows + pair * stride, 0.0F);
    std::fill(rows + (pair + 1) * stride, rows + pair_rows_.numel(), 0.0F);
    const auto reduce_start = Clock::now();
    times.compute += std::chrono::duration<double>(reduce_start - start).count();
    if (device_.kind == nodal::Device::Kind::cuda) {
      nodal::Tensor on_gpu = pair_rows_.to(device_);
      comm_.allreduce(on_gpu, nodal::ReduceOp::sum);
      nodal::Tensor back = on_gpu.to(nodal::Device{});
      std::memcpy(rows, back.data(), back.nbytes());
    } else {
      comm_.allreduce(pair_rows_, nodal::ReduceOp::sum);
    }
    resume = Clock::now();
    times.comm += std::chrono::duration<double>(resume - reduce_start).count();
    std::vector<float*> pairs;
    for (int j = 0; j < plan_.trainers / 2; ++j) pairs.push_back(rows + j * stride);
    tree_sum(pairs, stride);  // the levels above the pairs
    sum = rows;
  }
  Eigen::Map<Eigen::ArrayXf>(sum, static_cast<Eigen::Index>(stride)) /= static_cast<float>(plan_.shards);
  model_.sgd_step(sum, learning_rate(step), momentum_);
  times.compute += seconds_since(resume);
  return sum[Mlp::kParameterCount];
}

}  // namespace fashion_mnist
