// What rank 0 prints: a progress bar per epoch and the final summary.
#pragma once

#include <cstdint>
#include <string>

#include "plan.hpp"

namespace fashion_mnist {

/// One epoch's numbers.
struct EpochReport {
  int epoch = 0;          ///< from 0
  double train_loss = 0;  ///< mean over the epoch's steps
  double test_loss = 0;
  double test_accuracy = 0;
  double train_seconds = 0;  ///< the epoch's steps, evaluation excluded
};

/// A line per epoch. On a terminal the line is a bar redrawn in place (\r) as steps complete;
/// otherwise (a file, a pipe, nodalrun's tagged output) it is printed once, when the epoch ends.
class Progress {
 public:
  explicit Progress(const Plan& plan);
  /// After step `step` (0-based, within the epoch) of `epoch`, with the epoch's mean loss so far.
  void step(int epoch, std::int64_t step, double mean_loss);
  void end_epoch(const EpochReport& report);

 private:
  std::string prefix(int epoch) const;

  Plan plan_;
  bool terminal_;
  double last_draw_ = -1;  ///< seconds on the steady clock of the last redraw
};

/// The run's totals, for the summary.
struct Summary {
  EpochReport last;
  int trainers = 0;
  std::int64_t samples = 0;  ///< samples trained on, all epochs
  double train_seconds = 0;  ///< rank 0's steps, evaluation excluded
  double eval_seconds = 0;
  double wall_seconds = 0;  ///< rank 0, from start to end, data loading included
  // Mean over the trainers of each one's time per part of its steps.
  double load_seconds = 0;
  double compute_seconds = 0;
  double comm_seconds = 0;
  std::uint64_t fingerprint = 0;
};

void print_summary(const Summary& summary);

}  // namespace fashion_mnist
