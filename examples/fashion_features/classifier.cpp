#include "classifier.hpp"

namespace fashion_features {
namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// The rows of `features` with a constant 1 appended, in double.
Eigen::MatrixXd with_bias(const nodal::Tensor& features) {
  const Eigen::Map<const RowMatrix> x(features.data_ptr<float>(), features.shape()[0], features.shape()[1]);
  Eigen::MatrixXd out(x.rows(), x.cols() + 1);
  out.leftCols(x.cols()) = x.cast<double>();
  out.col(x.cols()).setOnes();
  return out;
}

}  // namespace

LinearClassifier fit(const nodal::Tensor& features, const std::uint8_t* labels, int classes, double lambda) {
  const Eigen::MatrixXd x = with_bias(features);
  Eigen::MatrixXd y = Eigen::MatrixXd::Zero(x.rows(), classes);
  for (Eigen::Index i = 0; i < x.rows(); ++i) y(i, labels[i]) = 1.0;
  Eigen::MatrixXd gram = x.transpose() * x;
  gram.diagonal().array() += lambda;
  return LinearClassifier{gram.llt().solve(x.transpose() * y)};
}

double accuracy(const LinearClassifier& model, const nodal::Tensor& features, const std::uint8_t* labels) {
  const Eigen::MatrixXd scores = with_bias(features) * model.weights;
  std::int64_t right = 0;
  for (Eigen::Index i = 0; i < scores.rows(); ++i) {
    Eigen::Index best = 0;
    scores.row(i).maxCoeff(&best);
    right += best == labels[i] ? 1 : 0;
  }
  return scores.rows() == 0 ? 0.0 : static_cast<double>(right) / static_cast<double>(scores.rows());
}

}  // namespace fashion_features
