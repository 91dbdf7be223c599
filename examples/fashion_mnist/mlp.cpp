#include "mlp.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

#include "random.hpp"

namespace fashion_mnist {
namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixMap = Eigen::Map<RowMatrix>;
using ConstMatrixMap = Eigen::Map<const RowMatrix>;
using VectorMap = Eigen::Map<Eigen::RowVectorXf>;
using ConstVectorMap = Eigen::Map<const Eigen::RowVectorXf>;

constexpr std::size_t padded(std::size_t floats) { return (floats + 15) / 16 * 16; }  // 16 floats: 64 bytes

struct Layer {
  int in;
  int out;
  std::size_t weights;  ///< offset of W [in, out]
  std::size_t bias;     ///< offset of b [out]
};

constexpr Layer kLayer1{Mlp::kInput, Mlp::kHidden1, 0, padded(std::size_t{Mlp::kInput} * Mlp::kHidden1)};
constexpr Layer kLayer2{Mlp::kHidden1, Mlp::kHidden2, kLayer1.bias + padded(Mlp::kHidden1),
                        kLayer1.bias + padded(Mlp::kHidden1) + padded(std::size_t{Mlp::kHidden1} * Mlp::kHidden2)};
constexpr Layer kLayer3{Mlp::kHidden2, Mlp::kOutput, kLayer2.bias + padded(Mlp::kHidden2),
                        kLayer2.bias + padded(Mlp::kHidden2) + padded(std::size_t{Mlp::kHidden2} * Mlp::kOutput)};
constexpr Layer kLayers[] = {kLayer1, kLayer2, kLayer3};
constexpr std::size_t kEnd = kLayer3.bias + padded(Mlp::kOutput);

constexpr std::uint64_t kInitPurpose = 2;
constexpr int kEvaluationChunk = 1000;  // rows per forward pass when evaluating

ConstMatrixMap weights(const float* buffer, const Layer& layer) {
  return {buffer + layer.weights, layer.in, layer.out};
}
ConstVectorMap bias(const float* buffer, const Layer& layer) { return {buffer + layer.bias, layer.out}; }
MatrixMap weights(float* buffer, const Layer& layer) { return {buffer + layer.weights, layer.in, layer.out}; }
VectorMap bias(float* buffer, const Layer& layer) { return {buffer + layer.bias, layer.out}; }

/// Rows of `logits` become softmax probabilities (max subtracted first, so exp cannot overflow);
/// returns the cross-entropy of row r for class label(r), summed over the rows in row order.
template <class Label>
double softmax_cross_entropy(Eigen::Ref<RowMatrix> logits, Label label) {
  double loss_sum = 0;
  for (Eigen::Index r = 0; r < logits.rows(); ++r) {
    auto row = logits.row(r);
    const float max = row.maxCoeff();
    const float target = row(label(r)) - max;
    float sum = 0;
    for (Eigen::Index c = 0; c < row.cols(); ++c) {
      row(c) = std::exp(row(c) - max);
      sum += row(c);
    }
    row /= sum;
    loss_sum += static_cast<double>(std::log(sum) - target);
  }
  return loss_sum;
}

}  // namespace

const std::size_t Mlp::kParameterCount = kEnd;
const std::size_t Mlp::kUnpaddedCount = [] {
  std::size_t n = 0;
  for (const Layer& layer : kLayers) n += std::size_t(layer.in) * layer.out + layer.out;
  return n;
}();

Mlp::Mlp(std::uint64_t seed) : parameters_(kEnd, 0.0F), velocity_(kEnd, 0.0F) {
  for (std::size_t l = 0; l < std::size(kLayers); ++l) {
    const Layer& layer = kLayers[l];
    SplitMix64 random(seed, kInitPurpose, l);
    const float limit = std::sqrt(6.0F / static_cast<float>(layer.in));
    float* w = parameters_.data() + layer.weights;
    for (std::size_t i = 0; i < std::size_t(layer.in) * layer.out; ++i) w[i] = (2 * random.uniform() - 1) * limit;
  }
}

void Mlp::forward(const float* x, int rows) {
  const float* p = parameters_.data();
  ConstMatrixMap input(x, rows, kInput);
  a1_.noalias() = input * weights(p, kLayer1);
  a1_.rowwise() += bias(p, kLayer1);
  a1_ = a1_.cwiseMax(0.0F);
  a2_.noalias() = a1_ * weights(p, kLayer2);
  a2_.rowwise() += bias(p, kLayer2);
  a2_ = a2_.cwiseMax(0.0F);
  probabilities_.noalias() = a2_ * weights(p, kLayer3);
  probabilities_.rowwise() += bias(p, kLayer3);
}

float Mlp::shard_gradient(const float* x, const std::int32_t* labels, int rows, float* grad) {
  forward(x, rows);
  const double loss_sum = softmax_cross_entropy(probabilities_, [labels](Eigen::Index r) { return labels[r]; });

  // d(mean loss)/d(logits) = (softmax - one_hot) / rows.
  d_logits_ = probabilities_;
  for (int r = 0; r < rows; ++r) d_logits_(r, labels[r]) -= 1.0F;
  d_logits_ /= static_cast<float>(rows);

  const float* p = parameters_.data();
  ConstMatrixMap input(x, rows, kInput);
  weights(grad, kLayer3).noalias() = a2_.transpose() * d_logits_;
  bias(grad, kLayer3) = d_logits_.colwise().sum();
  d_a2_.noalias() = d_logits_ * weights(p, kLayer3).transpose();
  d_a2_ = (a2_.array() > 0.0F).select(d_a2_, 0.0F);  // ReLU': 1 where the unit was active
  weights(grad, kLayer2).noalias() = a1_.transpose() * d_a2_;
  bias(grad, kLayer2) = d_a2_.colwise().sum();
  d_a1_.noalias() = d_a2_ * weights(p, kLayer2).transpose();
  d_a1_ = (a1_.array() > 0.0F).select(d_a1_, 0.0F);
  weights(grad, kLayer1).noalias() = input.transpose() * d_a1_;
  bias(grad, kLayer1) = d_a1_.colwise().sum();

  std::fill(grad + kLayer3.bias + kOutput, grad + kEnd, 0.0F);
  // -0.0 + 0.0 is +0.0: with no negative zeros left, the zeros the allreduce adds (the rows of
  // other trainers; x + 0 == x for every other x) change no bit. See trainer.hpp.
  Eigen::Map<Eigen::ArrayXf>(grad, static_cast<Eigen::Index>(kEnd)) += 0.0F;
  return static_cast<float>(loss_sum / rows);
}

void Mlp::sgd_step(const float* grad, float learning_rate, float momentum) {
  const auto n = static_cast<Eigen::Index>(kEnd);
  Eigen::Map<Eigen::ArrayXf> w(parameters_.data(), n);
  Eigen::Map<Eigen::ArrayXf> v(velocity_.data(), n);
  v = momentum * v + Eigen::Map<const Eigen::ArrayXf>(grad, n);
  w -= learning_rate * v;
}

Mlp::Evaluation Mlp::evaluate(const float* x, const std::uint8_t* labels, std::int64_t rows) {
  Evaluation result;
  for (std::int64_t begin = 0; begin < rows; begin += kEvaluationChunk) {
    const int chunk = static_cast<int>(std::min<std::int64_t>(kEvaluationChunk, rows - begin));
    forward(x + begin * kInput, chunk);
    const std::uint8_t* chunk_labels = labels + begin;
    result.loss_sum += softmax_cross_entropy(
        probabilities_, [chunk_labels](Eigen::Index r) { return static_cast<Eigen::Index>(chunk_labels[r]); });
    for (int r = 0; r < chunk; ++r) {
      Eigen::Index predicted = 0;
      probabilities_.row(r).maxCoeff(&predicted);
      result.correct += predicted == chunk_labels[r];
    }
  }
  return result;
}

std::vector<float> Mlp::unpadded_parameters() const {
  std::vector<float> out;
  out.reserve(kUnpaddedCount);
  for (const Layer& layer : kLayers) {
    const float* w = parameters_.data() + layer.weights;
    out.insert(out.end(), w, w + std::size_t(layer.in) * layer.out);
    const float* b = parameters_.data() + layer.bias;
    out.insert(out.end(), b, b + layer.out);
  }
  return out;
}

std::uint64_t Mlp::fingerprint() const {
  std::uint64_t hash = 0xcbf29ce484222325ULL;  // FNV-1a, 64 bits
  const auto* bytes = reinterpret_cast<const unsigned char*>(parameters_.data());
  for (std::size_t i = 0; i < parameters_.size() * sizeof(float); ++i) hash = (hash ^ bytes[i]) * 0x100000001b3ULL;
  return hash;
}

void Mlp::restore(const std::vector<float>& parameters, const std::vector<float>& velocity) {
  if (parameters.size() != kParameterCount || velocity.size() != kParameterCount) {
    throw std::invalid_argument(fmt::format("Mlp::restore: {} parameters and {} velocities, expected {} each",
                                            parameters.size(), velocity.size(), kParameterCount));
  }
  std::copy(parameters.begin(), parameters.end(), parameters_.begin());
  std::copy(velocity.begin(), velocity.end(), velocity_.begin());
}

}  // namespace fashion_mnist
