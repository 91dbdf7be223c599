#include "options.hpp"

#include <nodal/cuda.hpp>

#include <cstdio>
#include <cstdlib>
#include <map>

#include <CLI/CLI.hpp>

namespace fashion_mnist {

Options parse_options(int argc, char** argv) {
  Options o;
  CLI::App app(
      "Trains a 784-256-128-10 MLP on Fashion-MNIST: each trainer rank's nodal::data::DataLoader workers write "
      "batches into shared tensors, gradients are averaged with allreduce. "
      "Run it under nodalrun: nodalrun -n 2 fashion_mnist",
      "fashion_mnist");
  app.option_defaults()->always_capture_default();
  app.add_option("--data-dir", o.data_dir, "directory with the four *-ubyte.gz IDX files");
  app.add_option("--epochs", o.epochs, "passes over the training set")->check(CLI::Range(1, 1000));
  app.add_option("--global-batch", o.global_batch, "samples per step over all trainers")->check(CLI::Range(1, 1 << 20));
  app.add_option("--shards", o.shards,
                 "the global batch is split into this many shards (a power of two), whose gradients are summed "
                 "in a fixed order (the trainer count must be a power of two dividing it)")
      ->check(CLI::Range(1, 64));
  app.add_option("--lr", o.learning_rate, "SGD learning rate")->check(CLI::PositiveNumber);
  app.add_option("--momentum", o.momentum, "SGD momentum")->check(CLI::Range(0.0, 1.0));
  app.add_option("--seed", o.seed, "seeds the initial weights and the shuffling");
  app.add_option("--num-workers", o.num_workers,
                 "DataLoader worker processes per trainer (forkserver children sharing its decoded data)")
      ->check(CLI::Range(1, 64));
  app.add_option("--prefetch-factor", o.prefetch_factor, "batches each worker may have in flight ahead of its trainer")
      ->check(CLI::Range(1, 1024));
  app.add_option("--train-subset", o.train_subset, "train on the first N training samples (0: all)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{60000}));
  app.add_option("--test-subset", o.test_subset, "evaluate on the first N test samples (0: all)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{10000}));
  app.add_option("--device", o.device,
                 "where the gradient allreduce runs: cpu (shared memory), or cuda (the rank's GPU: NCCL with one GPU "
                 "per trainer, CUDA IPC when trainers share one; the model itself computes on the CPU)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--dump-weights", o.dump_weights, "rank 0 writes the final weights here (raw f32)");
  app.add_option("--checkpoint-every", o.checkpoint_every,
                 "trainer 0 checkpoints (weights, momentum, step) every K steps, and a restarted job resumes from the "
                 "checkpoint (nodalrun --max-restarts); 0: never")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 40));
  app.add_option("--checkpoint", o.checkpoint, "the checkpoint file (written atomically: temporary file, then rename)");
  app.add_option("--fail-at-step", o.fail_at_step,
                 "failure drill: crash at this global step (from 0), in the job's first attempt only");
  app.add_option("--fail-rank", o.fail_rank, "failure drill: the trainer rank that crashes, or whose dataset does");
  app.add_option("--fail-in", o.fail_in,
                 "failure drill: trainer, or dataset (the trainer's dataset throws, in a DataLoader worker, on the "
                 "first sample of that step)")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, FailIn>{{"trainer", FailIn::trainer}, {"dataset", FailIn::dataset}}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e) == 0 ? 0 : 2);
  }
  if (o.device == "cuda" && !nodal::cuda::built_with_cuda()) {  // asks no driver: CUDA must not start before fork
    std::fprintf(stderr, "fashion_mnist: --device cuda: %s; use --device cpu\n", nodal::cuda::unavailable_reason().c_str());
    std::exit(2);
  }
  if (o.global_batch % o.shards != 0) {
    std::fprintf(stderr, "fashion_mnist: --global-batch %d is not a multiple of --shards %d\n", o.global_batch,
                 o.shards);
    std::exit(2);
  }
  return o;
}

}  // namespace fashion_mnist
