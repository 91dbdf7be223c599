// nodal::data::DataLoader, timed as torch's DataLoader is in bench/peers/torch_dataloader.py:
// synthetic f32 samples of 4 KiB, 64 KiB, 1 MiB and 4 MiB whose every byte the worker writes
// (straight into the batch: Dataset::get_into), batch 32, 2 workers (forkserver), persistent,
// prefetch 2; the trainer takes each batch and drops it. Per sample size: the time to the first
// batch (DataLoader made, workers started, one batch delivered), then batches/s and GB/s over
// whole epochs (median of the epochs). Also this machine's write bandwidth (memset of mapped
// pages, one process, and two at once): the limit for the large samples.
// One line per figure: name,median,min,max,rounds (units in the name).
#include <nodal/data/dataloader.hpp>
#include <nodal/process.hpp>
#include <nodal/spawn.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace {

using Clock = std::chrono::steady_clock;
using nodal::Tensor;
using namespace nodal::data;

void report(const std::string& name, std::vector<double> values) {
  std::sort(values.begin(), values.end());
  fmt::print("{},{:.3f},{:.3f},{:.3f},{}\n", name, values[values.size() / 2], values.front(), values.back(),
             values.size());
}

/// `count` samples of `numel` f32, every element written with the sample's index.
class Synthetic : public Dataset {
 public:
  Synthetic(std::int64_t numel, std::int64_t count) : numel_(numel), count_(count) {}
  std::int64_t size() const override { return count_; }
  Sample get(std::int64_t index) override {
    Tensor t = Tensor::empty({numel_}, nodal::DType::f32);
    std::fill_n(t.data_ptr<float>(), numel_, static_cast<float>(index));
    Sample s;
    s.add("x", t);
    return s;
  }
  void get_into(std::int64_t index, const Sample& row) override {
    std::fill_n(row["x"].data_ptr<float>(), numel_, static_cast<float>(index));
  }

 private:
  std::int64_t numel_;
  std::int64_t count_;
};

struct Case {
  const char* name;
  std::int64_t bytes;
  std::int64_t batches_per_epoch;
};

/// memset bandwidth over a mapped 64 MiB buffer, GB/s, in `processes` processes at once.
double write_bandwidth(int processes) {
  constexpr std::size_t kBytes = 64 << 20;
  constexpr int kPasses = 20;
  std::vector<char> buffer(kBytes, 1);  // mapped before the clock starts
  const auto start = Clock::now();
  std::vector<pid_t> children;
  for (int p = 1; p < processes; ++p) {
    const pid_t child = ::fork();
    if (child == 0) {
      for (int k = 0; k < kPasses; ++k) std::memset(buffer.data(), k, kBytes);
      ::_exit(0);
    }
    children.push_back(child);
  }
  for (int k = 0; k < kPasses; ++k) std::memset(buffer.data(), k, kBytes);
  for (pid_t child : children) ::waitpid(child, nullptr, 0);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return static_cast<double>(kBytes) * kPasses * processes / seconds / 1e9;
}

}  // namespace

int main() {
  ::setenv("NODAL_SHM_SIZE", "3G", 0);  // 4 MiB samples: 5 batches of 128 MiB in flight
  const std::vector<Case> cases{{"4KiB", 4 << 10, 400}, {"64KiB", 64 << 10, 100}, {"1MiB", 1 << 20, 20},
                                {"4MiB", 4 << 20, 8}};
  constexpr int kEpochs = 7;
  // Every DataLoader first: the fork server (started with the first epoch) must see their datasets.
  std::vector<DataLoader> loaders;
  for (const Case& c : cases) {
    auto dataset = std::make_shared<Synthetic>(c.bytes / 4, 32 * c.batches_per_epoch);
    loaders.emplace_back(dataset, DataLoaderOptions{.batch_size = 32, .num_workers = 2, .prefetch_factor = 2,
                                                    .persistent_workers = true});
  }
  for (std::size_t k = 0; k < cases.size(); ++k) {
    const Case& c = cases[k];
    DataLoader& loader = loaders[k];
    const auto start = Clock::now();
    auto it = loader.begin();
    const double first_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    std::int64_t rest = 0;
    for (++it; it != loader.end(); ++it) ++rest;  // the first epoch: workers warm up
    if (rest != c.batches_per_epoch - 1) std::abort();
    std::vector<double> per_second;
    std::vector<double> gbps;
    for (int epoch = 0; epoch < kEpochs; ++epoch) {
      const auto t0 = Clock::now();
      std::int64_t batches = 0;
      for (const Batch& batch : loader) {
        if (batch.rows() != 32) std::abort();
        ++batches;
      }
      const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      per_second.push_back(static_cast<double>(batches) / seconds);
      gbps.push_back(static_cast<double>(batches) * 32.0 * static_cast<double>(c.bytes) / seconds / 1e9);
    }
    report(fmt::format("first_batch_ms_{}", c.name), {first_ms});
    report(fmt::format("batches_per_s_{}", c.name), per_second);
    report(fmt::format("GBps_{}", c.name), gbps);
  }
  loaders.clear();
  std::vector<double> one;
  std::vector<double> two;
  for (int r = 0; r < 5; ++r) {
    one.push_back(write_bandwidth(1));
    two.push_back(write_bandwidth(2));
  }
  report("write_bandwidth_GBps_1_process", one);
  report("write_bandwidth_GBps_2_processes", two);
  return 0;
}
