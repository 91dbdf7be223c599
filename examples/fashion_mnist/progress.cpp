#include "progress.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>

#include <fmt/format.h>

namespace fashion_mnist {
namespace {

constexpr int kBarWidth = 30;
constexpr double kRedrawSeconds = 0.1;

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

Progress::Progress(const Plan& plan) : plan_(plan), terminal_(::isatty(STDOUT_FILENO) == 1) {}

std::string Progress::prefix(int epoch) const {
  const int width = static_cast<int>(fmt::formatted_size("{}", plan_.epochs));
  return fmt::format("epoch {:>{}}/{}", epoch + 1, width, plan_.epochs);
}

void Progress::step(int epoch, std::int64_t step, double mean_loss) {
  if (!terminal_) return;
  const double now = now_seconds();
  const bool last = step + 1 == plan_.steps_per_epoch;
  if (!last && now - last_draw_ < kRedrawSeconds) return;
  last_draw_ = now;
  const auto done = static_cast<int>((step + 1) * kBarWidth / plan_.steps_per_epoch);
  fmt::print("\r{} [{:#<{}}{:-<{}}] {}/{} loss {:.4f}", prefix(epoch), "", done, "", kBarWidth - done, step + 1,
             plan_.steps_per_epoch, mean_loss);
  std::fflush(stdout);
}

void Progress::end_epoch(const EpochReport& r) {
  const double samples = static_cast<double>(plan_.steps_per_epoch) * plan_.global_batch;
  // On a terminal the line replaces the bar (the escape clears what the bar left to the right).
  fmt::print("{}{}  loss {:.4f}  test loss {:.4f}  test accuracy {:.4f}  {:.1f} s  {:.0f} samples/s\n",
             terminal_ ? "\r\x1b[K" : "", prefix(r.epoch), r.train_loss, r.test_loss, r.test_accuracy, r.train_seconds,
             samples / r.train_seconds);
  std::fflush(stdout);
}

void print_summary(const Summary& s) {
  const double step_seconds = s.load_seconds + s.compute_seconds + s.comm_seconds;
  auto share = [&](double part) { return step_seconds > 0 ? 100 * part / step_seconds : 0.0; };
  fmt::print("summary: train loss {:.4f}, test loss {:.4f}, test accuracy {:.4f} after {} epoch(s)\n",
             s.last.train_loss, s.last.test_loss, s.last.test_accuracy, s.last.epoch + 1);
  fmt::print(
      "summary: {:.0f} samples/s on {} trainer(s) ({} samples in {:.1f} s of training; evaluation {:.1f} s; "
      "wall time {:.1f} s)\n",
      static_cast<double>(s.samples) / s.train_seconds, s.trainers, s.samples, s.train_seconds, s.eval_seconds,
      s.wall_seconds);
  fmt::print(
      "summary: time per trainer in its steps: data loading {:.2f} s ({:.1f} %), compute {:.2f} s ({:.1f} %), "
      "communication {:.2f} s ({:.1f} %)\n",
      s.load_seconds, share(s.load_seconds), s.compute_seconds, share(s.compute_seconds), s.comm_seconds,
      share(s.comm_seconds));
  fmt::print("summary: weights fingerprint {:016x} (FNV-1a), the same on every trainer\n", s.fingerprint);
  std::fflush(stdout);
}

}  // namespace fashion_mnist
