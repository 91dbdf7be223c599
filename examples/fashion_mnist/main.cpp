// Fashion-MNIST, data parallel: the README's main job.
//
//   nodalrun -n 2 build/release/examples/fashion_mnist/fashion_mnist [--epochs N] [--num-workers K] ...
//
// Every rank of the job is a trainer (an MLP in Eigen; gradients combined with one allreduce per
// step, see trainer.hpp), fed by a nodal::data::DataLoader whose `--num-workers` forkserver
// workers write its part of each step's batch into the arena (dataset.hpp, TrainerSampler in
// plan.hpp). Rank 0 evaluates on the test set after each epoch, prints a line per epoch and a
// summary. `--fail-at-step K --fail-rank R` is the failure drill.
#include <nodal/cuda.hpp>
#include <nodal/data/dataloader.hpp>
#include <nodal/nodal.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <vector>

#include <Eigen/Core>
#include <fmt/format.h>

#include "checkpoint.hpp"
#include "dataset.hpp"
#include "idx.hpp"
#include "options.hpp"
#include "plan.hpp"
#include "progress.hpp"
#include "trainer.hpp"

namespace fashion_mnist {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

/// A usage error found after parsing (it depends on the world size): exit code 2.
class UsageProblem : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// Which start of the job this is (nodalrun --max-restarts): the failure drill fires in the first.
int restart_count() {
  const char* text = std::getenv("NODAL_RESTART_COUNT");
  return text ? std::atoi(text) : 0;
}

/// The checkpoint to resume from (--checkpoint-every), if there is one.
std::optional<Checkpoint> resume_point(const Options& options, const Plan& plan) {
  if (options.checkpoint_every <= 0) return std::nullopt;
  return load_checkpoint(options.checkpoint, plan, options);
}

/// The failure drill in trainer `trainer`'s dataset, if it is asked for: the first sample of
/// that trainer's part of step --fail-at-step throws (in the job's first attempt only).
DatasetDrill dataset_drill(const Options& options, const Plan& plan, int trainer) {
  if (options.fail_in != FailIn::dataset || options.fail_rank != trainer || options.fail_at_step < 0 ||
      restart_count() != 0) {
    return {};
  }
  const std::int64_t epoch = options.fail_at_step / plan.steps_per_epoch;
  if (epoch >= plan.epochs) return {};
  const std::vector<std::int32_t> order = epoch_order(plan, static_cast<int>(epoch));
  const std::int64_t sample = trainer_samples(plan, order, options.fail_at_step % plan.steps_per_epoch, trainer)[0];
  return {epoch, sample, options.fail_at_step, trainer};
}

/// The test set, normalised like the training batches.
struct TestSet {
  std::int64_t count = 0;
  std::vector<float> images;
  std::vector<std::uint8_t> labels;
};

TestSet load_test_set(const Options& options) {
  Split split = load_split(options.data_dir, SplitKind::test);
  TestSet test;
  test.count = options.test_subset > 0 ? std::min(options.test_subset, split.count) : split.count;
  test.images.resize(static_cast<std::size_t>(test.count) * kImageSize);
  normalise(split.pixels.data(), test.images.size(), test.images.data());
  split.labels.resize(static_cast<std::size_t>(test.count));
  test.labels = std::move(split.labels);
  return test;
}

void dump_weights(const Mlp& model, const std::string& path) {
  const std::vector<float> weights = model.unpadded_parameters();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(weights.data()),
            static_cast<std::streamsize>(weights.size() * sizeof(float)));
  out.close();
  if (!out) throw std::runtime_error(fmt::format("--dump-weights: cannot write {}", path));
  fmt::print("wrote {} weights (raw f32) to {}\n", weights.size(), path);
}

void run_trainer(const nodal::Context& ctx, const Options& options, const Plan& plan, Clock::time_point start) {
  const int trainer = ctx.rank();
  const bool reporter = trainer == 0;
  const std::optional<Checkpoint> resume = resume_point(options, plan);
  const std::int64_t first_step = resume ? resume->next_step : 0;
  std::optional<TestSet> test;
  if (reporter) test = load_test_set(options);

  // The training set is decoded here and the DataLoader made before its fork server starts: the
  // workers are forks of the server, so they share these pages copy-on-write and see the dataset.
  const Split train = load_split(options.data_dir, SplitKind::train);
  nodal::data::DataLoader loader(
      std::make_shared<FashionTrain>(train, plan.train_size, dataset_drill(options, plan, trainer)),
      {.batch_size = plan.local_batch(),
       .drop_last = true,
       .num_workers = options.num_workers,
       .prefetch_factor = options.prefetch_factor,
       .persistent_workers = true,
       .sampler = std::make_shared<TrainerSampler>(plan, trainer, first_step)});
  // Started now, while this process runs one thread and before CUDA (--device cuda) is used.
  nodal::start_forkserver();
  nodal::Communicator comm = ctx.world();

  if (reporter) {
    fmt::print(
        "fashion_mnist: {} trainer(s), {} DataLoader worker(s) each; global batch {} = {} shards x {}; {} steps "
        "per epoch, {} epoch(s); SGD lr {} momentum {}; seed {}\n",
        plan.trainers, options.num_workers, plan.global_batch, plan.shards, plan.shard_size, plan.steps_per_epoch, plan.epochs, options.learning_rate,
        options.momentum, options.seed);
    if (resume) {
      fmt::print("fashion_mnist: resuming from {} at step {} (epoch {}, restart {})\n", options.checkpoint, first_step,
                 first_step / plan.steps_per_epoch + 1, restart_count());
    }
    std::fflush(stdout);
  }

  // --device cuda: the GPU nodalrun --gpus gave this rank, else the first one (ranks then share it).
  // Asked only now: CUDA does not survive fork, and the workers' fork server has started above.
  nodal::Device device{};
  if (options.device == "cuda") {
    if (!nodal::cuda::available()) {
      throw UsageProblem(fmt::format("--device cuda: {}; use --device cpu", nodal::cuda::unavailable_reason()));
    }
    device = ctx.device().kind == nodal::Device::Kind::cuda ? ctx.device() : nodal::Device::cuda(0);
  }
  DataParallelTrainer trainer_state(plan, options, comm, device);
  if (resume) trainer_state.model().restore(resume->parameters, resume->velocity);
  Progress progress(plan);
  StepTimes times;
  Summary summary;
  const bool drill = options.fail_in == FailIn::trainer && trainer == options.fail_rank && restart_count() == 0;
  const int first_epoch = static_cast<int>(first_step / plan.steps_per_epoch);
  loader.set_epoch(first_epoch);
  for (int epoch = first_epoch; epoch < plan.epochs; ++epoch) {
    const auto epoch_start = Clock::now();
    double loss_sum = 0;
    std::int64_t steps_run = 0;
    // The sampler starts a resumed epoch at the checkpoint's step: batch n is that step + n.
    const std::int64_t skipped = epoch == first_epoch ? first_step % plan.steps_per_epoch : 0;
    for (std::int64_t step = skipped; step < plan.steps_per_epoch; ++step) {
      const std::int64_t global_step = epoch * plan.steps_per_epoch + step;
      if (drill && global_step == options.fail_at_step) {
        throw std::runtime_error(
            fmt::format("failure drill: trainer rank {} crashes at step {} (--fail-at-step)", trainer, global_step));
      }
      const auto wait_start = Clock::now();
      // Throws nodal::ProcessRaisedError when a worker's dataset threw (the worker, the sample,
      // its stack), nodal::ProcessExitedError when a worker died.
      const std::optional<nodal::data::Batch> batch = loader.next();
      times.load += seconds_since(wait_start);
      if (!batch || batch->number != step - skipped || batch->rows() != plan.local_batch()) {
        throw std::runtime_error(fmt::format("trainer {}: the DataLoader's batch for step {} is {}", trainer,
                                             global_step,
                                             batch ? fmt::format("batch {} of {} rows", batch->number, batch->rows())
                                                   : std::string("missing (the epoch ended)")));
      }
      loss_sum += trainer_state.step(global_step, *batch, times);
      ++steps_run;
      if (reporter) progress.step(epoch, step, loss_sum / static_cast<double>(steps_run));
      if (reporter && options.checkpoint_every > 0 && (global_step + 1) % options.checkpoint_every == 0) {
        Checkpoint checkpoint = checkpoint_of(plan, options);
        checkpoint.next_step = global_step + 1;
        checkpoint.parameters = trainer_state.model().parameters();
        checkpoint.velocity = trainer_state.model().velocity();
        save_checkpoint(checkpoint, options.checkpoint);
      }
    }
    if (std::optional<nodal::data::Batch> extra = loader.next()) {  // nullopt ends the epoch
      throw std::runtime_error(fmt::format("trainer {}: the DataLoader has more batches in epoch {} than its {} steps",
                                           trainer, epoch + 1, plan.steps_per_epoch));
    }
    EpochReport report;
    report.epoch = epoch;
    report.train_seconds = seconds_since(epoch_start);
    // A resumed epoch's loss is over the steps run since the checkpoint.
    report.train_loss = loss_sum / static_cast<double>(std::max<std::int64_t>(steps_run, 1));
    const auto eval_start = Clock::now();
    if (reporter) {
      const Mlp::Evaluation eval =
          trainer_state.model().evaluate(test->images.data(), test->labels.data(), test->count);
      report.test_loss = eval.loss_sum / static_cast<double>(test->count);
      report.test_accuracy = static_cast<double>(eval.correct) / static_cast<double>(test->count);
    }
    // The others wait here rather than in the next allreduce: evaluation is not communication.
    comm.barrier();
    summary.eval_seconds += seconds_since(eval_start);
    summary.train_seconds += report.train_seconds;
    summary.last = report;
    if (reporter) progress.end_epoch(report);
  }

  // The trainers' mean time per part, and a check that they all hold the same weights.
  double parts[3] = {times.load, times.compute, times.comm};
  comm.allreduce(parts, parts, 3, nodal::DType::f64, nodal::ReduceOp::avg);
  const std::uint64_t fingerprint = trainer_state.model().fingerprint();
  std::int64_t low = static_cast<std::int64_t>(fingerprint);
  std::int64_t high = low;
  comm.allreduce(&low, &low, 1, nodal::DType::i64, nodal::ReduceOp::min);
  comm.allreduce(&high, &high, 1, nodal::DType::i64, nodal::ReduceOp::max);
  if (low != high) {
    throw std::runtime_error(
        fmt::format("trainer {}: the trainers' weights differ (fingerprint {:016x}): data "
                    "parallelism went wrong",
                    trainer, fingerprint));
  }
  if (!reporter) return;
  summary.trainers = plan.trainers;
  summary.samples = (plan.total_steps() - first_step) * plan.global_batch;
  summary.wall_seconds = seconds_since(start);
  summary.load_seconds = parts[0];
  summary.compute_seconds = parts[1];
  summary.comm_seconds = parts[2];
  summary.fingerprint = fingerprint;
  print_summary(summary);
  if (!options.dump_weights.empty()) dump_weights(trainer_state.model(), options.dump_weights);
}

}  // namespace
}  // namespace fashion_mnist

int main(int argc, char** argv) {
  using namespace fashion_mnist;
  const auto start = Clock::now();
  const Options options = parse_options(argc, argv);
  const nodal::Context ctx = nodal::init();
  Eigen::setNbThreads(1);  // the trainers are the parallelism; and sums must not depend on threads
  try {
    const int trainers = ctx.world_size();
    if (options.fail_at_step >= 0 && (options.fail_rank < 0 || options.fail_rank >= trainers)) {
      throw UsageProblem(fmt::format("--fail-rank {}: the trainers are ranks 0..{}", options.fail_rank, trainers - 1));
    }
    const Plan plan = make_plan(options, split_size(SplitKind::train), trainers);
    run_trainer(ctx, options, plan, start);
  } catch (const DataError& e) {
    std::fprintf(stderr, "fashion_mnist: error: %s\n", e.what());
    return 1;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
    return 2;
  }
  nodal::finalize();  // the GPU collectives (--device cuda) close while CUDA still runs
  return 0;
}
