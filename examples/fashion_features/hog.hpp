// Histogram-of-oriented-gradients features of a 28x28 image (Dalal and Triggs, "Histograms of
// Oriented Gradients for Human Detection", CVPR 2005): centred [-1, 0, 1] gradients, 9 unsigned
// orientation bins (0-180 degrees) with linear voting between the two nearest bins, 7x7-pixel
// cells (4x4 of them), 2x2-cell blocks at a stride of one cell (3x3 of them), each block
// L2-Hys normalised (L2, clipped at 0.2, L2 again).
#pragma once

#include <nodal/tensor.hpp>

#include <cstdint>

namespace fashion_features {

inline constexpr int kSide = 28;
inline constexpr int kCell = 7;
inline constexpr int kCells = kSide / kCell;  // 4 per side
inline constexpr int kBins = 9;
inline constexpr int kBlocks = kCells - 1;  // 3 per side
/// Features per image: 3 x 3 blocks of 2 x 2 cells of 9 bins.
inline constexpr int kFeatures = kBlocks * kBlocks * 4 * kBins;  // 324

/// The features of one image: `pixels` u8 [784] row-major, `out` f32 [kFeatures]. Deterministic:
/// the same bytes in, the same bits out, in any process.
void hog(const std::uint8_t* pixels, float* out);

/// A Pool task: the features of every image of `images` (u8 [n, 784]) written in place into
/// `features` (f32 [n, kFeatures]), both slices of the caller's shared tensors. Returns n.
/// Throws std::invalid_argument on other shapes or dtypes.
std::int64_t hog_rows(nodal::Tensor images, nodal::Tensor features);

}  // namespace fashion_features
