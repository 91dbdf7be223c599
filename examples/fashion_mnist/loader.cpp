#include "loader.hpp"

#include <array>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace fashion_mnist {
namespace {

// The training set's pixel mean and standard deviation (of pixel / 255), the usual constants.
constexpr float kPixelMean = 0.2860F;
constexpr float kPixelStd = 0.3530F;

constexpr const char* kImagesText = "images";
constexpr const char* kLabelsText = "labels";

/// pixel -> normalised value, computed once: a lookup is exact and cheaper than the arithmetic.
std::array<float, 256> normalisation_table() {
  std::array<float, 256> table{};
  for (int v = 0; v < 256; ++v) table[v] = (static_cast<float>(v) / 255.0F - kPixelMean) / kPixelStd;
  return table;
}

}  // namespace

void normalise(const std::uint8_t* pixels, std::size_t count, float* out) {
  static const std::array<float, 256> table = normalisation_table();
  for (std::size_t i = 0; i < count; ++i) out[i] = table[pixels[i]];
}

std::string queue_name(int trainer, int slot) { return fmt::format("fashion_mnist.batches.{}.{}", trainer, slot); }

std::size_t queue_capacity(int prefetch) { return 2 * static_cast<std::size_t>(prefetch); }

void run_loader(const LoaderTask& task) {
  const Plan& plan = task.plan;
  nodal::TensorQueue queue =
      nodal::TensorQueue::open(queue_name(task.trainer, task.slot), queue_capacity(task.prefetch));
  const std::int64_t rows = plan.local_batch();
  for (int epoch = static_cast<int>(task.first_step / plan.steps_per_epoch); epoch < plan.epochs; ++epoch) {
    const std::vector<std::int32_t> order = epoch_order(plan, epoch);
    for (std::int64_t step = 0; step < plan.steps_per_epoch; ++step) {
      const std::int64_t global_step = epoch * plan.steps_per_epoch + step;
      if (global_step < task.first_step || global_step % task.loaders != task.slot) continue;
      if (global_step == task.fail_at) {
        throw std::runtime_error(fmt::format("failure drill: loader {} of trainer {} crashes at step {}", task.slot,
                                             task.trainer, global_step));
      }
      // Straight into the arena: put() then passes an offset, and the trainer reads these bytes.
      nodal::Tensor images = nodal::Tensor::empty_shared({rows, kImageSize}, nodal::DType::f32);
      nodal::Tensor labels = nodal::Tensor::empty_shared({rows}, nodal::DType::i32);
      float* image_out = images.data_ptr<float>();
      std::int32_t* label_out = labels.data_ptr<std::int32_t>();
      const std::span<const std::int32_t> samples = trainer_samples(plan, order, step, task.trainer);
      for (std::size_t i = 0; i < samples.size(); ++i) {
        const auto sample = static_cast<std::size_t>(samples[i]);
        normalise(task.train->pixels.data() + sample * kImageSize, kImageSize, image_out + i * kImageSize);
        label_out[i] = task.train->labels[sample];
      }
      queue.put({images, global_step, 0, kImagesText});
      queue.put({labels, global_step, 0, kLabelsText});
    }
  }
  queue.close();
}

BatchReceiver::BatchReceiver(int trainer, int loaders, int prefetch, std::int64_t rows)
    : trainer_(trainer), rows_(rows) {
  for (int slot = 0; slot < loaders; ++slot) {
    queues_.push_back(nodal::TensorQueue::open(queue_name(trainer, slot), queue_capacity(prefetch)));
  }
}

Batch BatchReceiver::next(std::int64_t step) {
  const auto slot = static_cast<std::size_t>(step % static_cast<std::int64_t>(queues_.size()));
  auto get = [&](const char* what, nodal::DType dtype, std::vector<std::int64_t> shape) {
    std::optional<nodal::QueueItem> item = queues_[slot].get();
    if (!item) {
      throw LoaderEnded(
          fmt::format("trainer {}: loader {}'s queue ended before the {} of step {}", trainer_, slot, what, step));
    }
    if (item->index != step || item->text != what) {
      throw std::runtime_error(fmt::format("trainer {}: loader {} sent the {} of step {} instead of the {} of step {}",
                                           trainer_, slot, item->text, item->index, what, step));
    }
    if (item->tensor.dtype() != dtype || item->tensor.shape() != shape || !item->tensor.is_contiguous()) {
      throw std::runtime_error(fmt::format("trainer {}: loader {} sent {} of step {} as {} [{}], expected {} [{}]",
                                           trainer_, slot, what, step, nodal::dtype_name(item->tensor.dtype()),
                                           fmt::join(item->tensor.shape(), ", "), nodal::dtype_name(dtype),
                                           fmt::join(shape, ", ")));
    }
    return std::move(item->tensor);
  };
  Batch batch;
  batch.images = get(kImagesText, nodal::DType::f32, {rows_, kImageSize});
  batch.labels = get(kLabelsText, nodal::DType::i32, {rows_});
  return batch;
}

void BatchReceiver::expect_end() {
  for (std::size_t slot = 0; slot < queues_.size(); ++slot) {
    if (std::optional<nodal::QueueItem> extra = queues_[slot].get()) {
      throw std::runtime_error(fmt::format("trainer {}: loader {} sent more batches than the plan has (step {})",
                                           trainer_, slot, extra->index));
    }
  }
}

void BatchReceiver::close() {
  for (nodal::TensorQueue& queue : queues_) queue.close();
}

}  // namespace fashion_mnist
