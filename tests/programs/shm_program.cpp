// Rank program for the shared-tensor tests: `shm_program MODE [ARGS...]` under nodalrun.
// Each mode checks its own results against an independent reference and prints what it found;
// the tests assert on that output and on nodalrun's exit code.
#include <nodal/arena.hpp>
#include <nodal/nodal.hpp>
#include <nodal/sync.hpp>
#include <nodal/tensor.hpp>
#include <nodal/tensor_queue.hpp>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

/// The bytes item `index` must hold: a generator independent of the queue and the arena.
void fill_reference(std::byte* data, std::size_t bytes, std::uint64_t index) {
  std::mt19937_64 random(index * 0x9E3779B97F4A7C15ULL + 1);
  for (std::size_t i = 0; i < bytes; i += 8) {
    std::uint64_t word = random();
    std::memcpy(data + i, &word, std::min<std::size_t>(8, bytes - i));
  }
}

bool matches_reference(const nodal::Tensor& t, std::uint64_t index) {
  std::vector<std::byte> expected(t.nbytes());
  fill_reference(expected.data(), expected.size(), index);
  return std::memcmp(expected.data(), t.data(), expected.size()) == 0;
}

/// Shapes and dtypes that cover every dtype and a few ranks of tensor.
nodal::Tensor make_item(std::uint64_t index, bool shared) {
  static const nodal::DType dtypes[] = {nodal::DType::bool_, nodal::DType::u8,  nodal::DType::i8,
                                        nodal::DType::i32,   nodal::DType::i64, nodal::DType::f16,
                                        nodal::DType::bf16,  nodal::DType::f32, nodal::DType::f64};
  nodal::DType dtype = dtypes[index % 9];
  std::vector<std::int64_t> shape = {static_cast<std::int64_t>(1 + index % 5), 7, static_cast<std::int64_t>(3 + index % 11)};
  nodal::Tensor t = shared ? nodal::Tensor::empty_shared(shape, dtype) : nodal::Tensor::empty(shape, dtype);
  fill_reference(static_cast<std::byte*>(t.data()), t.nbytes(), index);
  return t;
}

int handoff(const nodal::Context& ctx, int count) {
  // Rank 0 produces, alternately arena and private tensors; rank 1 checks every byte.
  nodal::TensorQueue queue = nodal::TensorQueue::open("handoff", 8);
  if (ctx.rank() == 0) {
    for (int i = 0; i < count; ++i) {
      nodal::Tensor t = make_item(static_cast<std::uint64_t>(i), i % 2 == 0);
      queue.put({t, i, i * 10, "item " + std::to_string(i)});
      if (!t.in_arena()) return 2;  // a private tensor must have moved into the arena
    }
    queue.close();
    return 0;
  }
  int verified = 0;
  while (std::optional<nodal::QueueItem> item = queue.get(30s)) {
    auto index = static_cast<std::uint64_t>(item->index);
    nodal::Tensor expected_shape = make_item(index, false);
    bool ok = item->tensor.shape() == expected_shape.shape() && item->tensor.dtype() == expected_shape.dtype() &&
              item->label == item->index * 10 && item->text == "item " + std::to_string(index) &&
              matches_reference(item->tensor, index) && item->index == verified;
    if (!ok) {
      std::printf("mismatch at item %lld\n", static_cast<long long>(item->index));
      return 1;
    }
    ++verified;
  }
  std::printf("verified %d\n", verified);
  return 0;
}

int mpmc(const nodal::Context& ctx) {
  // Ranks 0-3 produce 250 tensors each; ranks 4-6 consume; every index must arrive exactly once.
  constexpr int kProducers = 4, kPerProducer = 250, kTotal = kProducers * kPerProducer;
  if (ctx.world_size() != 7) return 64;
  nodal::TensorQueue queue = nodal::TensorQueue::open("mpmc", 16);
  nodal::Array<std::int32_t> seen = nodal::Array<std::int32_t>::open("seen", kTotal);
  nodal::Barrier everyone = nodal::Barrier::open("everyone", 7);
  everyone.wait(30s);  // all opened the queue before anyone closes it
  if (ctx.rank() < kProducers) {
    for (int i = 0; i < kPerProducer; ++i) {
      int index = ctx.rank() * kPerProducer + i;
      nodal::Tensor t = nodal::Tensor::empty_shared({64}, nodal::DType::i32);
      for (int k = 0; k < 64; ++k) t.data_ptr<std::int32_t>()[k] = index;
      queue.put({t, index, 0, {}});
    }
    nodal::Barrier::open("producers", kProducers).wait(30s);
    if (ctx.rank() == 0) queue.close();
  } else {
    int got = 0;
    while (std::optional<nodal::QueueItem> item = queue.get(30s)) {
      const auto* values = item->tensor.data_ptr<std::int32_t>();
      for (int k = 0; k < 64; ++k) {
        if (values[k] != item->index) return 3;
      }
      seen.get_lock().lock();
      seen[static_cast<std::size_t>(item->index)] += 1;
      seen.get_lock().unlock();
      ++got;
    }
    std::printf("consumer %d got %d\n", ctx.rank(), got);
  }
  everyone.wait(30s);
  if (ctx.rank() == 4) {
    int once = 0, other = 0;
    for (std::int32_t count : seen.data()) (count == 1 ? once : other) += 1;
    std::printf("exactly once %d, not once %d\n", once, other);
  }
  return 0;
}

int file_tensor(const nodal::Context& ctx, const std::string& path) {
  nodal::Barrier barrier = nodal::Barrier::open("file", ctx.world_size());
  if (ctx.rank() == 0) {
    nodal::Tensor t = nodal::Tensor::from_file(path, nodal::DType::f64, {128, 3}, nodal::FileMode::create);
    for (int i = 0; i < 384; ++i) t.data_ptr<double>()[i] = i * 0.5;
  }
  barrier.wait(30s);
  nodal::Tensor seen = nodal::Tensor::from_file(path, nodal::DType::f64, {128, 3}, nodal::FileMode::read_only);
  for (int i = 0; i < 384; ++i) {
    if (seen.data_ptr<double>()[i] != i * 0.5) return 1;
  }
  std::printf("rank %d read the file tensor\n", ctx.rank());
  return 0;
}

int hold_and_die(const nodal::Context& ctx, int megabytes, int victim) {
  // Every rank fills tensors, queues some; `victim` then dies by SIGKILL while holding its own
  // (-1: nobody; the test kills nodalrun instead).
  nodal::TensorQueue queue = nodal::TensorQueue::open("held", 4);
  std::vector<nodal::Tensor> held;
  for (int i = 0; i < 4; ++i) {
    nodal::Tensor t = nodal::Tensor::empty_shared({megabytes, 1 << 18}, nodal::DType::f32);
    std::memset(t.data(), 0x5a, t.nbytes());
    held.push_back(t);
  }
  queue.put(held[0], 5s);
  std::printf("ready %d %d\n", ctx.rank(), static_cast<int>(::getpid()));
  std::fflush(stdout);
  nodal::Barrier::open("held", ctx.world_size()).wait(30s);
  if (ctx.rank() == victim) ::raise(SIGKILL);
  for (;;) std::this_thread::sleep_for(1s);
}

int peer_failure(const nodal::Context& ctx) {
  // Rank 0 blocks in get(); rank 1, the producer, dies. Rank 0 must get PeerFailure, not hang.
  nodal::TensorQueue queue = nodal::TensorQueue::open("never", 4);
  if (ctx.rank() == 1) {
    std::this_thread::sleep_for(300ms);
    std::_Exit(7);
  }
  ::signal(SIGTERM, SIG_IGN);  // so the PeerFailure, not nodalrun's SIGTERM, ends this rank
  auto start = Clock::now();
  try {
    queue.get(30s);
    std::printf("get returned\n");
  } catch (const nodal::PeerFailure& e) {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
    std::printf("PeerFailure after %lld ms: %s\n", static_cast<long long>(ms), e.what());
  }
  std::fflush(stdout);
  return 0;
}

int sync_primitives(const nodal::Context& ctx) {
  // Value increments under the lock from every rank; a reused barrier; an event.
  nodal::Value<std::int64_t> counter = nodal::Value<std::int64_t>::open("counter", 0);
  nodal::Barrier barrier = nodal::Barrier::open("rounds", ctx.world_size());
  for (int i = 0; i < 1000; ++i) counter.update([](std::int64_t& v) { v += 1; });
  barrier.wait(30s);
  std::int64_t total = counter.get();
  nodal::Array<std::int32_t> slots = nodal::Array<std::int32_t>::open("slots", static_cast<std::size_t>(ctx.world_size()));
  int rounds_ok = 0;
  for (int round = 1; round <= 200; ++round) {
    slots[static_cast<std::size_t>(ctx.rank())] = round;
    barrier.wait(30s);
    bool all = true;
    for (std::int32_t v : slots.data()) all &= v == round;
    rounds_ok += all;
    barrier.wait(30s);
  }
  nodal::Event go = nodal::Event::open("go");
  if (ctx.rank() == 0) {
    std::this_thread::sleep_for(50ms);
    go.set();
  } else {
    go.wait(30s);
  }
  std::printf("rank %d counter %lld rounds %d event %d\n", ctx.rank(), static_cast<long long>(total), rounds_ok,
              go.is_set() ? 1 : 0);
  return 0;
}

int allocate(const std::string& bytes_text) {
  std::size_t bytes = std::strtoull(bytes_text.c_str(), nullptr, 10);
  try {
    nodal::Tensor t = nodal::Tensor::empty_shared({static_cast<std::int64_t>(bytes)}, nodal::DType::u8);
    std::memset(t.data(), 1, bytes);  // would be a SIGBUS if the pages were not reserved
    std::printf("allocated %zu\n", bytes);
  } catch (const nodal::ShmError& e) {
    std::printf("ShmError: %s\n", e.what());
  }
  return 0;
}

int squeeze(const std::string& dir, const std::string& bytes_text) {
  // Another tenant takes the directory's space after the arena started; the next allocation must
  // say so rather than SIGBUS.
  std::size_t fill = 6u << 20;
  {
    std::ofstream hog(dir + "/hog");
    std::string block(1 << 20, 'x');
    for (std::size_t i = 0; i < fill; i += block.size()) hog << block;
  }
  int rc = allocate(bytes_text);
  std::remove((dir + "/hog").c_str());
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  nodal::Context ctx = nodal::init();
  if (mode == "handoff") return handoff(ctx, argc > 2 ? std::atoi(argv[2]) : 200);
  if (mode == "mpmc") return mpmc(ctx);
  if (mode == "file_tensor" && argc > 2) return file_tensor(ctx, argv[2]);
  if (mode == "hold_and_die") return hold_and_die(ctx, argc > 2 ? std::atoi(argv[2]) : 16, argc > 3 ? std::atoi(argv[3]) : 1);
  if (mode == "peer_failure") return peer_failure(ctx);
  if (mode == "sync") return sync_primitives(ctx);
  if (mode == "allocate" && argc > 2) return allocate(argv[2]);
  if (mode == "squeeze" && argc > 3) return squeeze(argv[2], argv[3]);
  std::fprintf(stderr, "shm_program: unknown mode '%s'\n", mode.c_str());
  return 64;
}
