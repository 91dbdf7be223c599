// nodal::data: samplers (torch's orders, a DistributedSampler's shares) and the DataLoader with
// no workers and with fork and forkserver workers: batches in sampler order, written in place in
// the arena, persistent or per-epoch workers, worker_init_fn, a custom collate, and the faults (a
// sample's exception with the worker and the sample index, a killed worker, a timeout).
//
// ctest runs each test in a process of its own; a forkserver DataLoader must be made before the
// process's fork server starts, and no worker may be forked once CUDA is initialised (the
// pin_memory test), so when this binary runs all its tests in one process the worker tests that
// come after those skip, saying so.
#include <nodal/cuda.hpp>
#include <nodal/data/dataloader.hpp>
#include <nodal/data/worker_info.hpp>
#include <nodal/detail/forkserver.hpp>
#include <nodal/detail/gpu.hpp>
#include <nodal/detail/storage.hpp>
#include <nodal/arena.hpp>
#include <nodal/errors.hpp>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <numeric>
#include <optional>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace {

using namespace std::chrono_literals;
using nodal::StartMethod;
using nodal::Tensor;
using namespace nodal::data;

/// Sample i: "x" f32 [3] all i, "y" the scalar i, "via" 0 when made by get() and 1 when written
/// in place by get_into(). Sample `throw_at` throws, `kill_at` kills its process, `sleep_at`
/// takes 5 s.
class Numbers : public Dataset {
 public:
  explicit Numbers(std::int64_t size) : size_(size) {}
  std::int64_t size() const override { return size_; }
  Sample get(std::int64_t index) override {
    act(index);
    Tensor x = Tensor::empty({3}, nodal::DType::f32);
    std::fill_n(x.data_ptr<float>(), 3, static_cast<float>(index));
    Sample s;
    s.add("x", x).add("y", index).add("via", std::int64_t{0});
    return s;
  }
  void get_into(std::int64_t index, const Sample& row) override {
    act(index);
    std::fill_n(row["x"].data_ptr<float>(), 3, static_cast<float>(index));
    *row["y"].data_ptr<std::int64_t>() = index;
    *row["via"].data_ptr<std::int64_t>() = 1;
  }

  std::int64_t throw_at = -1;
  std::int64_t kill_at = -1;
  std::int64_t sleep_at = -1;

 private:
  void act(std::int64_t index) const {
    if (index == throw_at) throw std::out_of_range("sample " + std::to_string(index) + " is unreadable");
    if (index == kill_at) ::raise(SIGKILL);
    if (index == sleep_at) std::this_thread::sleep_for(5s);
  }
  std::int64_t size_;
};

std::vector<std::int64_t> ys(const Batch& batch) {
  const Tensor& y = batch["y"];
  return {y.data_ptr<std::int64_t>(), y.data_ptr<std::int64_t>() + y.numel()};
}

std::vector<std::int64_t> all_ys(DataLoader& loader) {
  std::vector<std::int64_t> out;
  for (const Batch& batch : loader) {
    const std::vector<std::int64_t> y = ys(batch);
    out.insert(out.end(), y.begin(), y.end());
  }
  return out;
}

// ---- Samplers ------------------------------------------------------------------------------

TEST(Samplers, SequentialAndRandomAreTorchsOrders) {
  EXPECT_EQ(SequentialSampler(4).indices(7), (std::vector<std::int64_t>{0, 1, 2, 3}));
  RandomSampler random(100, 42);
  const auto a = random.indices(0);
  EXPECT_EQ(a, random.indices(0)) << "the same epoch, the same order";
  EXPECT_NE(a, random.indices(1)) << "another epoch, another order";
  EXPECT_NE(a, SequentialSampler(100).indices(0));
  std::vector<std::int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, SequentialSampler(100).indices(0)) << "a permutation";
}

TEST(Samplers, DistributedSharesAreTorchs) {
  // 10 samples over 3 ranks: ceil(10/3) = 4 each, the 2 missing repeat the start.
  std::vector<std::int64_t> seen;
  for (int rank = 0; rank < 3; ++rank) {
    DistributedSampler sampler(10, {.rank = rank, .world_size = 3, .shuffle = false});
    EXPECT_EQ(sampler.size(), 4);
    const auto mine = sampler.indices(0);
    ASSERT_EQ(mine.size(), 4U);
    EXPECT_EQ(mine[0], rank);
    seen.insert(seen.end(), mine.begin(), mine.end());
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, (std::vector<std::int64_t>{0, 0, 1, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  // drop_last: floor(10/3) = 3 each, nothing repeated.
  std::set<std::int64_t> unique;
  for (int rank = 0; rank < 3; ++rank) {
    DistributedSampler sampler(10, {.rank = rank, .world_size = 3, .shuffle = true, .seed = 5, .drop_last = true});
    const auto mine = sampler.indices(2);
    EXPECT_EQ(mine.size(), 3U);
    unique.insert(mine.begin(), mine.end());
  }
  EXPECT_EQ(unique.size(), 9U) << "the ranks' shares of one epoch do not overlap";
  EXPECT_THROW(DistributedSampler(10, {.rank = 3, .world_size = 3}), nodal::UsageError);
}

// ---- No workers ----------------------------------------------------------------------------

TEST(DataLoaderInline, BatchesStackEveryFieldInSamplerOrder) {
  DataLoader loader(std::make_shared<Numbers>(10), {.batch_size = 4});
  EXPECT_EQ(loader.size(), 3);
  std::vector<Batch> batches;
  for (const Batch& batch : loader) batches.push_back(batch);
  ASSERT_EQ(batches.size(), 3U);
  EXPECT_EQ(batches[0]["x"].shape(), (std::vector<std::int64_t>{4, 3}));
  EXPECT_EQ(batches[0]["y"].shape(), (std::vector<std::int64_t>{4}));
  EXPECT_EQ(batches[2].rows(), 2) << "the last batch is short without drop_last";
  EXPECT_EQ(batches[2].number, 2);
  EXPECT_EQ(ys(batches[1]), (std::vector<std::int64_t>{4, 5, 6, 7}));
  EXPECT_EQ(batches[1]["x"].data_ptr<float>()[3 * 2 + 1], 6.0F);
  DataLoader dropping(std::make_shared<Numbers>(10), {.batch_size = 4, .drop_last = true});
  EXPECT_EQ(all_ys(dropping).size(), 8U);
}

TEST(DataLoaderInline, ShuffleIsTheRandomSamplersOrderAndChangesEachEpoch) {
  DataLoader loader(std::make_shared<Numbers>(50), {.batch_size = 8, .shuffle = true, .seed = 3});
  const auto first = all_ys(loader);
  const auto second = all_ys(loader);
  EXPECT_EQ(first, RandomSampler(50, 3).indices(0));
  EXPECT_EQ(second, RandomSampler(50, 3).indices(1));
  loader.set_epoch(0);
  EXPECT_EQ(all_ys(loader), first) << "set_epoch replays an epoch";
}

TEST(DataLoaderInline, MisuseIsUsageError) {
  EXPECT_THROW(DataLoader(std::shared_ptr<Dataset>()), nodal::UsageError);
  EXPECT_THROW(DataLoader(std::make_shared<Numbers>(4), {.batch_size = 0}), nodal::UsageError);
  EXPECT_THROW(DataLoader(std::make_shared<Numbers>(4), {.num_workers = 1, .start_method = StartMethod::spawn}),
               nodal::UsageError);
}

// ---- Workers -------------------------------------------------------------------------------

class DataLoaderWorkers : public ::testing::TestWithParam<StartMethod> {
 protected:
  void SetUp() override {
    if ((GetParam() == StartMethod::forkserver && nodal::detail::running_forkserver() != 0) ||
        nodal::detail::gpu::cuda_initialized()) {
      GTEST_SKIP() << "an earlier test in this process started the fork server or CUDA: run this test alone, as "
                      "ctest does";
    }
  }
  DataLoaderOptions options(DataLoaderOptions o) const {
    o.start_method = GetParam();
    return o;
  }
};

TEST_P(DataLoaderWorkers, BatchesComeInSamplerOrderWrittenInPlaceInTheArena) {
  DataLoader loader(std::make_shared<Numbers>(103),
                    options({.batch_size = 8, .shuffle = true, .seed = 9, .num_workers = 2, .prefetch_factor = 2}));
  for (std::int64_t epoch = 0; epoch < 2; ++epoch) {
    std::vector<std::int64_t> order;
    std::int64_t via_get = 0;
    std::int64_t number = 0;
    for (const Batch& batch : loader) {
      EXPECT_EQ(batch.number, number++);
      EXPECT_TRUE(batch["x"].in_arena()) << "the worker's batch, read in place";
      const std::vector<std::int64_t> y = ys(batch);
      for (std::int64_t k = 0; k < batch.rows(); ++k) {
        EXPECT_EQ(batch["x"].data_ptr<float>()[k * 3 + 2], static_cast<float>(y[static_cast<std::size_t>(k)]));
        via_get += 1 - batch["via"].data_ptr<std::int64_t>()[k];
      }
      order.insert(order.end(), y.begin(), y.end());
    }
    EXPECT_EQ(order, RandomSampler(103, 9).indices(epoch));
    // Each worker learns the batch layout from its first sample (got whole); every other sample
    // is written straight into its row.
    EXPECT_EQ(via_get, 2) << "epoch " << epoch;
  }
}

TEST_P(DataLoaderWorkers, PersistentWorkersStayAndOthersEndWithTheEpoch) {
  // Both made first: a forkserver DataLoader must exist before the fork server starts.
  DataLoader persistent(std::make_shared<Numbers>(20),
                        options({.batch_size = 4, .num_workers = 2, .persistent_workers = true}));
  DataLoader per_epoch(std::make_shared<Numbers>(20), options({.batch_size = 4, .num_workers = 2}));
  all_ys(persistent);
  const std::vector<pid_t> pids = persistent.worker_pids();
  EXPECT_EQ(pids.size(), 2U);
  all_ys(persistent);
  EXPECT_EQ(persistent.worker_pids(), pids);

  auto it = per_epoch.begin();
  const std::vector<pid_t> first = per_epoch.worker_pids();
  EXPECT_EQ(first.size(), 2U);
  while (it != per_epoch.end()) ++it;
  EXPECT_TRUE(per_epoch.worker_pids().empty()) << "the workers ended with the epoch";
  for (pid_t pid : first) EXPECT_NE(::kill(pid, 0), 0) << pid << " still runs";
}

TEST_P(DataLoaderWorkers, EpochsAfterEpochsGiveTheArenaBackItsMemory) {
  // Per-epoch workers: each epoch's queues and batches go back to the arena.
  DataLoader loader(std::make_shared<Numbers>(16), options({.batch_size = 4, .num_workers = 2}));
  all_ys(loader);
  const std::size_t free_after_one = nodal::detail::job_arena().free_bytes();
  for (int epoch = 0; epoch < 30; ++epoch) all_ys(loader);
  EXPECT_GE(nodal::detail::job_arena().free_bytes() + 16 * 1024, free_after_one)
      << "30 epochs kept what they used (4 queues each)";
}

std::int64_t g_worker_seed = -1;
void remember_seed(int, std::uint64_t seed) { g_worker_seed = static_cast<std::int64_t>(seed); }

/// Sample i's "y" is the seed the worker's init function got.
class Seeds : public Numbers {
 public:
  using Numbers::Numbers;
  void get_into(std::int64_t index, const Sample& row) override {
    *row["y"].data_ptr<std::int64_t>() = g_worker_seed;
    *row["i"].data_ptr<std::int64_t>() = index;
  }
  Sample get(std::int64_t index) override {
    Sample s;
    s.add("y", g_worker_seed).add("i", index);
    return s;
  }
};

TEST_P(DataLoaderWorkers, WorkerInitFnGetsEachWorkersSeed) {
  DataLoader loader(std::make_shared<Seeds>(16), options({.batch_size = 2, .seed = 100, .num_workers = 2,
                                                          .worker_init_fn = &remember_seed}));
  for (std::int64_t epoch = 0; epoch < 2; ++epoch) {
    std::set<std::int64_t> seeds;
    for (const Batch& batch : loader) {
      for (std::int64_t y : ys(batch)) seeds.insert(y);
    }
    // Base seed + epoch * workers + worker id: the epoch's new workers get new seeds.
    EXPECT_EQ(seeds, (std::set<std::int64_t>{100 + 2 * epoch, 101 + 2 * epoch})) << "epoch " << epoch;
  }
}

/// Sample i's "id", "workers" and "epoch" are what worker_info() said while it was made (-1: nullopt).
class WhoMadeIt : public Dataset {
 public:
  explicit WhoMadeIt(std::int64_t size) : size_(size) {}
  std::int64_t size() const override { return size_; }
  Sample get(std::int64_t index) override {
    const std::optional<WorkerInfo> info = worker_info();
    Sample s;
    s.add("id", std::int64_t{info ? info->id : -1})
        .add("workers", std::int64_t{info ? info->num_workers : -1})
        .add("epoch", info ? info->epoch : -1)
        .add("i", index);
    return s;
  }

 private:
  std::int64_t size_;
};

std::set<std::vector<std::int64_t>> who_made(DataLoader& loader) {
  std::set<std::vector<std::int64_t>> out;
  for (const Batch& batch : loader) {
    for (std::int64_t k = 0; k < batch.rows(); ++k) {
      out.insert({batch["id"].data_ptr<std::int64_t>()[k], batch["workers"].data_ptr<std::int64_t>()[k],
                  batch["epoch"].data_ptr<std::int64_t>()[k]});
    }
  }
  return out;
}

TEST(DataLoaderInline, WorkerInfoIsNulloptInTheCallingProcess) {
  EXPECT_FALSE(worker_info().has_value());
  DataLoader loader(std::make_shared<WhoMadeIt>(6), {.batch_size = 2});
  EXPECT_EQ(who_made(loader), (std::set<std::vector<std::int64_t>>{{-1, -1, -1}}));
}

TEST_P(DataLoaderWorkers, WorkerInfoNamesTheWorkerAndTheEpochEvenInPersistentWorkers) {
  DataLoader persistent(std::make_shared<WhoMadeIt>(12),
                        options({.batch_size = 2, .num_workers = 2, .persistent_workers = true}));
  DataLoader per_epoch(std::make_shared<WhoMadeIt>(12), options({.batch_size = 2, .num_workers = 2}));
  persistent.set_epoch(5);
  per_epoch.set_epoch(5);
  for (std::int64_t epoch = 5; epoch < 8; ++epoch) {
    const std::set<std::vector<std::int64_t>> expected{{0, 2, epoch}, {1, 2, epoch}};
    EXPECT_EQ(who_made(persistent), expected) << "epoch " << epoch;
    EXPECT_EQ(who_made(per_epoch), expected) << "epoch " << epoch;
  }
  EXPECT_FALSE(worker_info().has_value()) << "the trainer is no worker";
}

void refuse_to_start(int worker, std::uint64_t) {
  if (worker == 0) throw std::runtime_error("no GPU for worker 0");
}

TEST_P(DataLoaderWorkers, AWorkerInitFnsExceptionIsNamed) {
  DataLoader loader(std::make_shared<Numbers>(16),
                    options({.batch_size = 2, .num_workers = 2, .worker_init_fn = &refuse_to_start}));
  try {
    all_ys(loader);
    FAIL() << "no error";
  } catch (const nodal::ProcessRaisedError& e) {
    EXPECT_NE(std::string(e.what()).find("DataLoader worker 0's worker_init_fn"), std::string::npos) << e.what();
    EXPECT_NE(e.child_report().find("no GPU for worker 0"), std::string::npos) << e.child_report();
  }
}

TEST_P(DataLoaderWorkers, ALoaderMovedInTheMiddleOfAnEpochGoesOn) {
  auto moved_from = std::make_unique<DataLoader>(std::make_shared<Numbers>(12),
                                                 options({.batch_size = 4, .num_workers = 2}));
  std::vector<std::int64_t> got = ys(*moved_from->next());
  DataLoader loader = std::move(*moved_from);
  moved_from.reset();
  while (std::optional<Batch> batch = loader.next()) {
    const auto y = ys(*batch);
    got.insert(got.end(), y.begin(), y.end());
  }
  EXPECT_EQ(got, SequentialSampler(12).indices(0));
}

Batch sum_collate(std::vector<Sample>&& samples) {
  std::int64_t sum = 0;
  for (const Sample& s : samples) sum += *s["y"].data_ptr<std::int64_t>();
  Tensor t = Tensor::empty({1}, nodal::DType::i64);
  *t.data_ptr<std::int64_t>() = sum;
  Batch batch;
  batch.add("y", t);
  return batch;
}

TEST_P(DataLoaderWorkers, ACustomCollateRunsInTheWorker) {
  DataLoader loader(std::make_shared<Numbers>(10),
                    options({.batch_size = 5, .num_workers = 2, .collate = &sum_collate}));
  EXPECT_EQ(all_ys(loader), (std::vector<std::int64_t>{0 + 1 + 2 + 3 + 4, 5 + 6 + 7 + 8 + 9}));
}

TEST_P(DataLoaderWorkers, ASamplesExceptionNamesTheWorkerAndTheSample) {
  auto dataset = std::make_shared<Numbers>(40);
  dataset->throw_at = 13;
  DataLoader loader(dataset, options({.batch_size = 4, .num_workers = 2}));
  try {
    all_ys(loader);
    FAIL() << "no error";
  } catch (const nodal::ProcessRaisedError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("DataLoader worker 1, loading sample 13 of batch 3"), std::string::npos) << what;
    EXPECT_EQ(e.child_report().rfind("std::out_of_range: sample 13 is unreadable\n", 0), 0U) << e.child_report();
    EXPECT_NE(e.child_report().find(" 0# "), std::string::npos) << "the worker's stack: " << e.child_report();
  }
  EXPECT_TRUE(loader.worker_pids().empty()) << "the failed epoch's workers are gone";
}

TEST_P(DataLoaderWorkers, AKilledWorkerIsNamedNotAHang) {
  auto dataset = std::make_shared<Numbers>(40);
  dataset->kill_at = 21;
  DataLoader loader(dataset, options({.batch_size = 4, .num_workers = 2}));
  try {
    all_ys(loader);
    FAIL() << "no error";
  } catch (const nodal::ProcessExitedError& e) {
    EXPECT_EQ(e.signal(), SIGKILL);
    EXPECT_NE(std::string(e.what()).find("DataLoader worker 1, making batch 5"), std::string::npos) << e.what();
  }
}

TEST_P(DataLoaderWorkers, ATimeoutIsAnError) {
  auto dataset = std::make_shared<Numbers>(40);
  dataset->sleep_at = 9;
  DataLoader loader(dataset, options({.batch_size = 4, .num_workers = 2, .timeout = 300ms}));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(all_ys(loader), nodal::TimeoutError);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 4s) << "the sleeping worker was not waited for";
}

/// An iterable dataset of `size` samples: worker w of W streams i = w, w + W, ... ("y" = i + 1000
/// * epoch); worker `throw_worker` throws at the third sample of its stream.
class Counting : public IterableDataset {
 public:
  explicit Counting(std::int64_t size) : size_(size) {}
  void start(int worker, int workers, std::int64_t epoch) override {
    next_ = worker;
    step_ = workers;
    epoch_ = epoch;
    worker_ = worker;
    taken_ = 0;
  }
  std::optional<Sample> next() override {
    if (next_ >= size_) return std::nullopt;
    if (worker_ == throw_worker && taken_ == 2) throw std::runtime_error("the stream broke");
    Sample s;
    s.add("y", next_ + 1000 * epoch_);
    next_ += step_;
    ++taken_;
    return s;
  }
  int throw_worker = -1;

 private:
  std::int64_t size_;
  std::int64_t next_ = 0;
  std::int64_t step_ = 1;
  std::int64_t epoch_ = 0;
  int worker_ = 0;
  std::int64_t taken_ = 0;
};

TEST(DataLoaderIterable, InProcessBatchesTheStream) {
  DataLoader loader(std::make_shared<Counting>(10), {.batch_size = 4});
  std::vector<std::vector<std::int64_t>> batches;
  for (const Batch& batch : loader) batches.push_back(ys(batch));
  EXPECT_EQ(batches, (std::vector<std::vector<std::int64_t>>{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9}}));
  EXPECT_EQ(all_ys(loader), (std::vector<std::int64_t>{1000, 1001, 1002, 1003, 1004, 1005, 1006, 1007, 1008, 1009}))
      << "the second epoch";
  DataLoader dropping(std::make_shared<Counting>(10), {.batch_size = 4, .drop_last = true});
  EXPECT_EQ(all_ys(dropping).size(), 8U);
  EXPECT_THROW(DataLoader(std::make_shared<Counting>(10), {.shuffle = true}), nodal::UsageError);
  EXPECT_THROW(loader.size(), nodal::UsageError);
}

TEST_P(DataLoaderWorkers, AnIterableDatasetStreamsFromEachWorkerInTurn) {
  auto failing = std::make_shared<Counting>(20);
  failing->throw_worker = 1;
  DataLoader loader(std::make_shared<Counting>(20),
                    options({.batch_size = 4, .num_workers = 2, .persistent_workers = true}));
  DataLoader broken(failing, options({.batch_size = 4, .num_workers = 2}));
  for (std::int64_t epoch = 0; epoch < 2; ++epoch) {
    std::vector<std::vector<std::int64_t>> batches;
    for (const Batch& batch : loader) {
      EXPECT_EQ(batch.number, static_cast<std::int64_t>(batches.size()));
      batches.push_back(ys(batch));
    }
    const std::int64_t e = 1000 * epoch;
    // Worker 0 streams the even samples, worker 1 the odd ones, 10 each: 4, 4 and a short 2.
    EXPECT_EQ(batches, (std::vector<std::vector<std::int64_t>>{{e + 0, e + 2, e + 4, e + 6},
                                                               {e + 1, e + 3, e + 5, e + 7},
                                                               {e + 8, e + 10, e + 12, e + 14},
                                                               {e + 9, e + 11, e + 13, e + 15},
                                                               {e + 16, e + 18},
                                                               {e + 17, e + 19}}))
        << "epoch " << epoch;
  }
  try {
    all_ys(broken);
    FAIL() << "no error";
  } catch (const nodal::ProcessRaisedError& e) {
    EXPECT_NE(std::string(e.what()).find("DataLoader worker 1, loading sample 2 of its stream"), std::string::npos)
        << e.what();
    EXPECT_NE(e.child_report().find("the stream broke"), std::string::npos) << e.child_report();
  }
}

INSTANTIATE_TEST_SUITE_P(Methods, DataLoaderWorkers, ::testing::Values(StartMethod::fork, StartMethod::forkserver),
                         [](const ::testing::TestParamInfo<StartMethod>& param) {
                           return std::string(param.param == StartMethod::fork ? "fork" : "forkserver");
                         });

TEST(DataLoaderForkserver, ADataLoaderMadeAfterTheServerStartedIsAClearError) {
  nodal::start_forkserver();
  DataLoader loader(std::make_shared<Numbers>(8), {.batch_size = 4, .num_workers = 1});
  try {
    all_ys(loader);
    FAIL() << "no error";
  } catch (const nodal::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("the fork server started before this DataLoader was made"),
              std::string::npos)
        << e.what();
  }
}

// Last: it initialises CUDA (where it is built), after which this process may not fork.
TEST(DataLoaderPinMemory, PinsWhereAGpuIsAndIsAClearErrorElsewhere) {
  if (!nodal::cuda::built_with_cuda()) {
    EXPECT_THROW(DataLoader(std::make_shared<Numbers>(4), {.batch_size = 2, .pin_memory = true}), nodal::UsageError);
    return;
  }
  DataLoader pinned(std::make_shared<Numbers>(4), {.batch_size = 2, .pin_memory = true});
  if (nodal::cuda::available()) {
    EXPECT_EQ(all_ys(pinned), (std::vector<std::int64_t>{0, 1, 2, 3})) << "the arena registered, batches as usual";
    return;
  }
  try {
    all_ys(pinned);
    FAIL() << "no error";
  } catch (const nodal::CudaError& e) {
    EXPECT_NE(std::string(e.what()).find("pinning host memory"), std::string::npos) << e.what();
  }
}

}  // namespace
