#include "hog.hpp"

#include <array>
#include <cmath>
#include <numbers>
#include <stdexcept>

namespace fashion_features {

void hog(const std::uint8_t* pixels, float* out) {
  auto at = [&](int y, int x) {
    y = y < 0 ? 0 : (y >= kSide ? kSide - 1 : y);
    x = x < 0 ? 0 : (x >= kSide ? kSide - 1 : x);
    return static_cast<float>(pixels[y * kSide + x]) / 255.0F;
  };
  std::array<float, kCells * kCells * kBins> cells{};
  constexpr float kBinWidth = 180.0F / kBins;
  for (int y = 0; y < kSide; ++y) {
    for (int x = 0; x < kSide; ++x) {
      const float gx = at(y, x + 1) - at(y, x - 1);
      const float gy = at(y + 1, x) - at(y - 1, x);
      const float magnitude = std::sqrt(gx * gx + gy * gy);
      if (magnitude == 0.0F) continue;
      float angle = std::atan2(gy, gx) * (180.0F / std::numbers::pi_v<float>);
      if (angle < 0.0F) angle += 180.0F;
      if (angle >= 180.0F) angle -= 180.0F;
      // Bin b's centre is (b + 0.5) * width; the vote splits between the two nearest centres.
      const float position = angle / kBinWidth - 0.5F;
      const int lower = static_cast<int>(std::floor(position));
      const float upper_share = position - static_cast<float>(lower);
      float* cell = &cells[((y / kCell) * kCells + x / kCell) * kBins];
      cell[(lower + kBins) % kBins] += magnitude * (1.0F - upper_share);
      cell[(lower + 1) % kBins] += magnitude * upper_share;
    }
  }
  constexpr float kEpsilon = 1e-3F;
  auto normalise = [&](float* v, int n) {
    float sum = 0.0F;
    for (int i = 0; i < n; ++i) sum += v[i] * v[i];
    const float scale = 1.0F / std::sqrt(sum + kEpsilon * kEpsilon);
    for (int i = 0; i < n; ++i) v[i] *= scale;
  };
  for (int by = 0; by < kBlocks; ++by) {
    for (int bx = 0; bx < kBlocks; ++bx) {
      float* block = out + (by * kBlocks + bx) * 4 * kBins;
      for (int cy = 0; cy < 2; ++cy) {
        for (int cx = 0; cx < 2; ++cx) {
          const float* cell = &cells[((by + cy) * kCells + bx + cx) * kBins];
          for (int b = 0; b < kBins; ++b) block[(cy * 2 + cx) * kBins + b] = cell[b];
        }
      }
      normalise(block, 4 * kBins);
      for (int i = 0; i < 4 * kBins; ++i) block[i] = std::min(block[i], 0.2F);
      normalise(block, 4 * kBins);
    }
  }
}

std::int64_t hog_rows(nodal::Tensor images, nodal::Tensor features) {
  if (images.dtype() != nodal::DType::u8 || images.dim() != 2 || images.shape()[1] != kSide * kSide ||
      !images.is_contiguous()) {
    throw std::invalid_argument("hog_rows: images must be contiguous u8 [n, 784]");
  }
  if (features.dtype() != nodal::DType::f32 || features.dim() != 2 || features.shape()[0] != images.shape()[0] ||
      features.shape()[1] != kFeatures || !features.is_contiguous()) {
    throw std::invalid_argument("hog_rows: features must be contiguous f32 [n, 324], n as for the images");
  }
  const auto* pixels = images.data_ptr<std::uint8_t>();
  float* out = features.data_ptr<float>();
  for (std::int64_t row = 0; row < images.shape()[0]; ++row) hog(pixels + row * kSide * kSide, out + row * kFeatures);
  return images.shape()[0];
}

}  // namespace fashion_features
