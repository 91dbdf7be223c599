// TensorQueue hand-off latency, producer -> consumer, under nodalrun -n 2:
//   nodalrun -n 2 build/release/bench/queue_handoff [--repeats N]
// For each size: arena tensors ping-pong between the ranks (one-way = round trip / 2, the tensor
// itself travels both ways); private tensors make the one-copy trip into the arena (put) and an
// empty message comes back (its one-way cost, measured alone, is subtracted). Rank 0 prints a
// markdown table with medians, and the share_memory() copy rate against memcpy in the same run.
// Anchor (DESIGN.md, 16-core GPU machine): torch.multiprocessing.Queue 11.7 ms per 1 KiB tensor,
// 148 ms per 64 MiB shared tensor.
#include <nodal/nodal.hpp>
#include <nodal/tensor.hpp>
#include <nodal/tensor_queue.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double us_since(Clock::time_point t) { return std::chrono::duration<double, std::micro>(Clock::now() - t).count(); }

struct Row {
  std::size_t bytes;
  double arena_us;
  double private_us;
  double share_gbps;
  double memcpy_gbps;
};

std::string size_name(std::size_t bytes) {
  return bytes >= (1u << 20) ? fmt::format("{} MiB", bytes >> 20) : fmt::format("{} KiB", bytes >> 10);
}

}  // namespace

int main(int argc, char** argv) {
  nodal::Context ctx = nodal::init();
  int repeats = 200;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--repeats") repeats = std::atoi(argv[i + 1]);
  }
  if (ctx.world_size() != 2) {
    std::fprintf(stderr, "run me with nodalrun -n 2\n");
    return 2;
  }
  nodal::TensorQueue to_consumer = nodal::TensorQueue::open("bench.to", 4);
  nodal::TensorQueue to_producer = nodal::TensorQueue::open("bench.back", 4);
  const std::vector<std::size_t> sizes = {1u << 10, 1u << 20, 64u << 20, 256u << 20};

  // The empty message's one-way cost, to take out of the private path's round trip.
  std::vector<double> empty_rtt;
  for (int i = 0; i < repeats * 5; ++i) {
    if (ctx.rank() == 0) {
      auto t0 = Clock::now();
      to_consumer.put(nodal::QueueItem{});
      to_producer.get();
      empty_rtt.push_back(us_since(t0));
    } else {
      to_consumer.get();
      to_producer.put(nodal::QueueItem{});
    }
  }
  const double empty_one_way = median(empty_rtt) / 2;

  std::vector<Row> rows;
  for (std::size_t bytes : sizes) {
    const int n = bytes >= (64u << 20) ? std::max(5, repeats / 20) : repeats;
    Row row{bytes, 0, 0, 0, 0};
    // Arena tensors: zero-copy both ways.
    std::vector<double> rtt;
    if (ctx.rank() == 0) {
      nodal::Tensor t = nodal::Tensor::empty_shared({static_cast<std::int64_t>(bytes)}, nodal::DType::u8);
      std::memset(t.data(), 1, bytes);
      for (int i = 0; i < n; ++i) {
        auto t0 = Clock::now();
        to_consumer.put(t);
        t = to_producer.get()->tensor;
        rtt.push_back(us_since(t0));
      }
      row.arena_us = median(rtt) / 2;
    } else {
      for (int i = 0; i < n; ++i) to_producer.put(to_consumer.get()->tensor);
    }
    // Private tensors: one copy into the arena on put.
    const int m = bytes >= (64u << 20) ? 5 : std::min(n, 50);
    std::vector<double> one_copy;
    if (ctx.rank() == 0) {
      std::vector<nodal::Tensor> privates;
      for (int i = 0; i < m; ++i) {
        privates.push_back(nodal::Tensor::empty({static_cast<std::int64_t>(bytes)}, nodal::DType::u8));
        std::memset(privates.back().data(), 2, bytes);  // fault the pages in before timing
      }
      for (int i = 0; i < m; ++i) {
        auto t0 = Clock::now();
        to_consumer.put(privates[i]);
        to_producer.get();
        one_copy.push_back(us_since(t0) - empty_one_way);
        privates[i] = nodal::Tensor();  // free its arena block for the next one to reuse
      }
      row.private_us = median(one_copy);
      // share_memory() and memcpy over the same bytes, interleaved.
      std::vector<double> share, copy;
      nodal::Tensor src = nodal::Tensor::empty({static_cast<std::int64_t>(bytes)}, nodal::DType::u8);
      nodal::Tensor dst = nodal::Tensor::empty({static_cast<std::int64_t>(bytes)}, nodal::DType::u8);
      std::memset(src.data(), 3, bytes);
      std::memset(dst.data(), 0, bytes);
      for (int i = 0; i < m; ++i) {
        nodal::Tensor p = src.clone();
        auto t0 = Clock::now();
        p.share_memory();
        share.push_back(us_since(t0));
        t0 = Clock::now();
        std::memcpy(dst.data(), src.data(), bytes);
        copy.push_back(us_since(t0));
      }
      row.share_gbps = static_cast<double>(bytes) / median(share) / 1e3;
      row.memcpy_gbps = static_cast<double>(bytes) / median(copy) / 1e3;
      rows.push_back(row);
    } else {
      for (int i = 0; i < m; ++i) {
        to_consumer.get();
        to_producer.put(nodal::QueueItem{});
      }
    }
  }
  if (ctx.rank() != 0) return 0;
  fmt::print("TensorQueue hand-off, 2 ranks, medians ({} repeats; empty message one-way {:.2f} us)\n\n", repeats,
             empty_one_way);
  fmt::print("| size | arena tensor, one-way | private tensor (one copy in) | share_memory() | memcpy | share/memcpy |\n");
  fmt::print("|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    fmt::print("| {} | {:.2f} us | {:.1f} us | {:.2f} GB/s | {:.2f} GB/s | {:.2f} |\n", size_name(r.bytes), r.arena_us,
               r.private_us, r.share_gbps, r.memcpy_gbps, r.share_gbps / r.memcpy_gbps);
  }
  return 0;
}
