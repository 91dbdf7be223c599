// A linear classifier fitted in closed form: ridge regression of one-hot labels on the features
// plus a constant (W = (X'X + lambda I)^-1 X'Y, solved by Cholesky). The prediction is the class
// with the largest score.
#pragma once

#include <nodal/tensor.hpp>

#include <Eigen/Dense>

#include <cstdint>

namespace fashion_features {

struct LinearClassifier {
  Eigen::MatrixXd weights;  ///< [features + 1, classes], the last row the bias
};

/// Fits on `features` f32 [n, f] (contiguous) with `labels` u8 [n] in 0..classes-1. lambda >= 0.
LinearClassifier fit(const nodal::Tensor& features, const std::uint8_t* labels, int classes, double lambda);

/// The share of rows of `features` whose predicted class is their label.
double accuracy(const LinearClassifier& model, const nodal::Tensor& features, const std::uint8_t* labels);

}  // namespace fashion_features
