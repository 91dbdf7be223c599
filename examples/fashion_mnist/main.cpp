// Fashion-MNIST, data parallel: the README's main job.
//
//   nodalrun -n 2 build/release/examples/fashion_mnist/fashion_mnist [--epochs N] [--loaders K] ...
//
// Every rank of the job is a trainer (an MLP in Eigen; gradients combined with one allreduce per
// step, see trainer.hpp), fed by loader processes through TensorQueues of shared tensors (see
// loader.hpp): by default `--loaders` children per trainer started with nodal::spawn, or with
// --loader-ranks extra ranks of the job. Rank 0 evaluates on the test set after each epoch,
// prints a line per epoch and a summary. `--fail-at-step K --fail-rank R` is the failure drill.
#include <nodal/cuda.hpp>
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
#include "idx.hpp"
#include "loader.hpp"
#include "loader_children.hpp"
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

/// How many of the job's ranks train (the others load, with --loader-ranks).
int trainer_count(const Options& options, int world_size) {
  if (options.placement == LoaderPlacement::children) return world_size;
  if (world_size % (1 + options.loaders) != 0) {
    throw UsageProblem(
        fmt::format("--loader-ranks with --loaders {}: the job's {} ranks must be T * {} (T trainers "
                    "and {} loader rank(s) for each)",
                    options.loaders, world_size, 1 + options.loaders, options.loaders));
  }
  return world_size / (1 + options.loaders);
}

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

LoaderTask loader_task(const Options& options, const Plan& plan, const Split* train, int trainer, int slot,
                       std::int64_t first_step) {
  LoaderTask task;
  task.train = train;
  task.plan = plan;
  task.trainer = trainer;
  task.slot = slot;
  task.loaders = options.loaders;
  task.prefetch = options.prefetch;
  const bool drill =
      options.fail_in == FailIn::loader && options.fail_rank == trainer && slot == 0 && restart_count() == 0;
  task.fail_at = drill ? options.fail_at_step : -1;
  task.first_step = first_step;
  return task;
}

/// A loader rank (--loader-ranks): rank trainers + t * loaders + j is slot j of trainer t.
void run_loader_rank(const nodal::Context& ctx, const Options& options, const Plan& plan) {
  ctx.world().split(-1, ctx.rank());  // collective: the trainers make their communicator
  const int index = ctx.rank() - plan.trainers;
  const Split train = load_split(options.data_dir, SplitKind::train);
  const std::optional<Checkpoint> resume = resume_point(options, plan);
  run_loader(loader_task(options, plan, &train, index / options.loaders, index % options.loaders,
                         resume ? resume->next_step : 0));
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

  // Children mode: decode the training set here, before the fork server starts, so that the
  // loaders share these pages copy-on-write instead of decoding it once each.
  std::optional<Split> train;
  std::unique_ptr<LoaderChildren> children;
  if (options.placement == LoaderPlacement::children) {
    train = load_split(options.data_dir, SplitKind::train);
    children = std::make_unique<LoaderChildren>(loader_task(options, plan, &*train, trainer, 0, first_step));
  }
  nodal::Communicator world = ctx.world();
  nodal::Communicator comm = options.placement == LoaderPlacement::ranks ? world.split(0, ctx.rank()) : world;

  if (reporter) {
    fmt::print(
        "fashion_mnist: {} trainer(s), {} loader(s) each ({}); global batch {} = {} shards x {}; {} steps "
        "per epoch, {} epoch(s); SGD lr {} momentum {}; seed {}\n",
        plan.trainers, options.loaders,
        options.placement == LoaderPlacement::children ? "nodal::spawn children" : "ranks of the job",
        plan.global_batch, plan.shards, plan.shard_size, plan.steps_per_epoch, plan.epochs, options.learning_rate,
        options.momentum, options.seed);
    if (resume) {
      fmt::print("fashion_mnist: resuming from {} at step {} (epoch {}, restart {})\n", options.checkpoint, first_step,
                 first_step / plan.steps_per_epoch + 1, restart_count());
    }
    std::fflush(stdout);
  }

  BatchReceiver receiver(trainer, options.loaders, options.prefetch, plan.local_batch());
  // --device cuda: the GPU nodalrun --gpus gave this rank, else the first one (ranks then share it).
  // Asked only now: CUDA does not survive fork, and the loaders' fork server has started above.
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
  auto next_batch = [&](std::int64_t step) {
    try {
      return receiver.next(step);
    } catch (const LoaderEnded&) {
      if (children) children->rethrow_failure();  // why the queue ended, if a loader child failed
      throw;
    }
  };

  const bool drill = options.fail_in == FailIn::trainer && trainer == options.fail_rank && restart_count() == 0;
  for (int epoch = static_cast<int>(first_step / plan.steps_per_epoch); epoch < plan.epochs; ++epoch) {
    const auto epoch_start = Clock::now();
    double loss_sum = 0;
    std::int64_t steps_run = 0;
    for (std::int64_t step = 0; step < plan.steps_per_epoch; ++step) {
      const std::int64_t global_step = epoch * plan.steps_per_epoch + step;
      if (global_step < first_step) continue;  // trained before the checkpoint
      if (drill && global_step == options.fail_at_step) {
        throw std::runtime_error(
            fmt::format("failure drill: trainer rank {} crashes at step {} (--fail-at-step)", trainer, global_step));
      }
      const auto wait_start = Clock::now();
      const Batch batch = next_batch(global_step);
      times.load += seconds_since(wait_start);
      loss_sum += trainer_state.step(global_step, batch, times);
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
  receiver.expect_end();
  if (children) children->join();

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
    const int trainers = trainer_count(options, ctx.world_size());
    if (options.fail_at_step >= 0 && (options.fail_rank < 0 || options.fail_rank >= trainers)) {
      throw UsageProblem(fmt::format("--fail-rank {}: the trainers are ranks 0..{}", options.fail_rank, trainers - 1));
    }
    const Plan plan = make_plan(options, split_size(SplitKind::train), trainers);
    if (ctx.rank() < trainers) {
      run_trainer(ctx, options, plan, start);
    } else {
      run_loader_rank(ctx, options, plan);
    }
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
