// copy-bandwidth: the machine's memcpy rate, the bound the large collectives are measured against
// (a one-pass allreduce moves a copy's traffic per rank; bench/results/*-push-allreduce.md).
//
//   build/release/bench/copy-bandwidth --bytes 64M --threads 2
//
// Each of `--threads` threads (1 .. threads, one line each) copies its own buffer of `--bytes`
// into another, `--repeats` times at once with the others; a line gives the median over repeats
// of each thread's bytes / time (GB/s = 1e9 bytes/s), the slowest thread's median first.
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "collective_bench.hpp"

namespace {

/// Median GB/s of each of `threads` threads copying `bytes` at once, `repeats` times.
std::vector<double> copy_rates(int threads, std::size_t bytes, int repeats) {
  std::vector<double> rates(static_cast<std::size_t>(threads));
  std::barrier start(threads);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      // Written once so that the timed copies pay no first-touch page faults.
      auto from = std::make_unique<std::byte[]>(bytes), to = std::make_unique<std::byte[]>(bytes);
      std::memset(from.get(), 1, bytes);
      std::memset(to.get(), 2, bytes);
      std::vector<double> rate;
      for (int i = 0; i < repeats; ++i) {
        start.arrive_and_wait();
        auto begin = std::chrono::steady_clock::now();
        std::memcpy(to.get(), from.get(), bytes);
        std::chrono::duration<double> took = std::chrono::steady_clock::now() - begin;
        rate.push_back(static_cast<double>(bytes) / took.count() / 1e9);
      }
      std::sort(rate.begin(), rate.end());
      rates[static_cast<std::size_t>(t)] = rate[rate.size() / 2];
    });
  }
  for (auto& w : workers) w.join();
  std::sort(rates.begin(), rates.end());
  return rates;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"copy-bandwidth: memcpy GB/s of 1 .. --threads threads copying at once"};
  std::string bytes_text = "64M";
  int threads = 2;
  int repeats = 15;
  app.add_option("--bytes", bytes_text, "bytes each thread copies (K, M, G suffixes)")->capture_default_str();
  app.add_option("--threads", threads, "the most threads copying at once")->check(CLI::Range(1, 256))->capture_default_str();
  app.add_option("--repeats", repeats, "copies per thread; the median counts")->check(CLI::Range(1, 100000))->capture_default_str();
  std::size_t bytes = 0;
  try {
    app.parse(argc, argv);
    bytes = collective_bench::parse_bytes(bytes_text);  // "64M": the sizes nodal-bench takes
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  fmt::print("threads,bytes,slowest_GBps,per_thread_GBps\n");
  for (int t = 1; t <= threads; ++t) {
    std::vector<double> rates = copy_rates(t, bytes, repeats);
    fmt::print("{},{},{:.2f},{:.2f}\n", t, bytes, rates.front(), fmt::join(rates, " "));
  }
  return 0;
}
