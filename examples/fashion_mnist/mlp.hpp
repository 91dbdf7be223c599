// The classifier: a 784-256-128-10 multilayer perceptron with ReLU and softmax cross-entropy,
// trained by SGD with momentum; the math is Eigen's.
#pragma once

#include <Eigen/Core>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace fashion_mnist {

/// Parameters live in one flat f32 buffer, and so does a gradient, in the same layout: W1 [784,256],
/// b1 [256], W2 [256,128], b2 [128], W3 [128,10], b3 [10], weights row-major ([in, out]), each
/// block starting on a 64-byte boundary (padding is zero). One buffer makes the gradient one
/// allreduce; the alignment makes Eigen take the same code path (so the same rounding) for a
/// block wherever the buffer is.
class Mlp {
 public:
  static constexpr int kInput = 784;
  static constexpr int kHidden1 = 256;
  static constexpr int kHidden2 = 128;
  static constexpr int kOutput = 10;
  /// Floats in a parameter or gradient buffer, padding included (a multiple of 16).
  static const std::size_t kParameterCount;
  /// Floats a model has, without padding: 235146.
  static const std::size_t kUnpaddedCount;

  /// He-uniform weights (He et al., "Delving deep into rectifiers", 2015) drawn from `seed`,
  /// zero biases: every trainer builds the same model from the same seed.
  explicit Mlp(std::uint64_t seed);

  /// Forward and backward over one shard: x f32 [rows, 784] row-major, labels i32 [rows] in 0..9.
  /// Writes the gradient of the shard's mean loss to grad (kParameterCount floats, 64-byte
  /// aligned) and returns that mean loss. The result depends only on the inputs and the weights
  /// (Eigen runs on one thread; the order of every sum is fixed by the shapes).
  float shard_gradient(const float* x, const std::int32_t* labels, int rows, float* grad);

  /// SGD with momentum as PyTorch writes it: v = momentum * v + grad; w -= lr * v.
  void sgd_step(const float* grad, float learning_rate, float momentum);

  struct Evaluation {
    double loss_sum = 0;  ///< cross-entropy summed over the samples
    std::int64_t correct = 0;
  };
  /// Loss and correct predictions over x f32 [rows, 784] with labels u8 [rows].
  Evaluation evaluate(const float* x, const std::uint8_t* labels, std::int64_t rows);

  /// The parameters without padding, layer after layer (what --dump-weights writes).
  std::vector<float> unpadded_parameters() const;
  /// FNV-1a over the parameter bytes: equal on every trainer, or data parallelism went wrong.
  std::uint64_t fingerprint() const;

  /// The training state as a checkpoint holds it: parameters and momentum buffer, padded layout
  /// (kParameterCount floats each).
  std::vector<float> parameters() const { return {parameters_.begin(), parameters_.end()}; }
  std::vector<float> velocity() const { return {velocity_.begin(), velocity_.end()}; }
  /// Takes both back. Throws std::invalid_argument when a buffer is not kParameterCount floats.
  void restore(const std::vector<float>& parameters, const std::vector<float>& velocity);

 private:
  using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

  /// Fills a1_, a2_ and probabilities_ for rows of x.
  void forward(const float* x, int rows);

  std::vector<float, Eigen::aligned_allocator<float>> parameters_;
  std::vector<float, Eigen::aligned_allocator<float>> velocity_;
  // Activations and their gradients for the rows in flight, reused from call to call.
  RowMatrix a1_, a2_, probabilities_, d_logits_, d_a2_, d_a1_;
};

}  // namespace fashion_mnist
