// TensorQueue and the process-shared sync objects within one process (threads stand in for
// ranks here; the cross-process cases are in tests/integration/shm_test.cpp).
#include <gtest/gtest.h>

#include <nodal/errors.hpp>
#include <nodal/sync.hpp>
#include <nodal/tensor.hpp>
#include <nodal/tensor_queue.hpp>
#include <nodal/arena.hpp>
#include <nodal/detail/storage.hpp>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

namespace nodal {
namespace {

using namespace std::chrono_literals;

TEST(TensorQueue, CloseLetsConsumersDrainThenEndsTheStream) {
  TensorQueue q = TensorQueue::open("unit.drain", 4);
  Tensor t = Tensor::empty({3}, DType::i32);
  for (int i = 0; i < 3; ++i) t.data_ptr<std::int32_t>()[i] = 7 * i;
  q.put({t, 1, 2, "hello"});
  q.put(QueueItem{});  // a message without a tensor
  q.close();
  EXPECT_TRUE(q.closed());
  EXPECT_EQ(q.size(), 2u);
  std::optional<QueueItem> first = q.get(1s);
  ASSERT_TRUE(first);
  EXPECT_EQ(first->index, 1);
  EXPECT_EQ(first->label, 2);
  EXPECT_EQ(first->text, "hello");
  EXPECT_EQ(first->tensor.data_ptr<std::int32_t>()[2], 14);
  EXPECT_TRUE(t.in_arena()) << "put moves a private tensor into the arena";
  EXPECT_EQ(first->tensor.data(), t.data()) << "the consumer sees the producer's storage, not a copy";
  std::optional<QueueItem> second = q.try_get();
  ASSERT_TRUE(second);
  EXPECT_FALSE(second->tensor.defined());
  EXPECT_FALSE(q.get(1s)) << "closed and drained: end of stream";
  EXPECT_THROW(q.put(t), UsageError);
}

TEST(TensorQueue, GetAndPutTimeOut) {
  TensorQueue q = TensorQueue::open("unit.timeout", 1);
  auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(q.get(50ms), TimeoutError);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 50ms);
  q.put(QueueItem{});
  EXPECT_THROW(q.put(QueueItem{}, 50ms), TimeoutError);  // full
  EXPECT_FALSE(q.try_get() == std::nullopt);
  EXPECT_EQ(q.try_get(), std::nullopt);
}

TEST(TensorQueue, APutBlockedOnAFullQueueSeesClose) {
  TensorQueue q = TensorQueue::open("unit.blocked", 1);
  q.put(QueueItem{});
  std::thread closer([&] {
    std::this_thread::sleep_for(50ms);
    q.close();
  });
  EXPECT_THROW(q.put(QueueItem{}, 5s), UsageError);
  closer.join();
}

TEST(TensorQueue, RefusesBadArguments) {
  TensorQueue::open("unit.capacity", 8);
  EXPECT_THROW(TensorQueue::open("unit.capacity", 16), UsageError);
  EXPECT_THROW(TensorQueue::open("unit.zero", 0), UsageError);
}

TEST(TensorQueue, AnItemCarriesBytesOfAnySizeAndAnyNumberOfTensors) {
  TensorQueue q = TensorQueue::open("unit.message", 2);
  const std::size_t free_before = detail::job_arena().free_bytes();
  std::string payload(1 << 20, '\0');
  for (std::size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>(i * 7 + i / 251);
  std::vector<Tensor> tensors;
  for (int k = 0; k < 3; ++k) {
    Tensor t = k == 1 ? Tensor::empty_shared({16}, DType::f32) : Tensor::empty({16}, DType::f32);
    for (int i = 0; i < 16; ++i) t.data_ptr<float>()[i] = static_cast<float>(100 * k + i);
    tensors.push_back(t);
  }
  Tensor strided = Tensor::empty({4, 4}, DType::f32);
  for (int i = 0; i < 16; ++i) strided.data_ptr<float>()[i] = static_cast<float>(i);
  // Its transpose, a view with strides (4 bytes in, 1 element across) into the same storage.
  tensors.push_back(Tensor(strided.storage(), 0, {4, 4}, {1, 4}, DType::f32));
  q.put({Tensor(), 5, 6, payload, tensors});
  q.put({Tensor(), 7, 0, "short", {}});
  std::optional<QueueItem> got = q.get(1s);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->index, 5);
  EXPECT_EQ(got->text.size(), payload.size());
  EXPECT_TRUE(got->text == payload) << "the bytes, NULs included, arrive unchanged";
  ASSERT_EQ(got->tensors.size(), 4u);
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(got->tensors[k].data(), tensors[k].data()) << "tensor " << k << " travels by handle, not by copy";
    EXPECT_EQ(got->tensors[k].data_ptr<float>()[15], static_cast<float>(100 * k + 15));
  }
  EXPECT_EQ(got->tensors[3].strides(), tensors[3].strides()) << "a view keeps its strides";
  EXPECT_EQ(got->tensors[3].data_ptr<float>()[0 * 1 + 1 * 4], 4.0F);  // element [0][1] of the transpose
  std::optional<QueueItem> second = q.get(1s);
  ASSERT_TRUE(second);
  EXPECT_EQ(second->text, "short");
  EXPECT_TRUE(second->tensors.empty());
  got.reset();
  second.reset();
  tensors.clear();
  strided = Tensor();
  // The extra block and the tensors moved into the arena are all given back.
  EXPECT_EQ(detail::job_arena().free_bytes(), free_before);

  // A put that cannot happen gives back what it took.
  q.put({Tensor(), 0, 0, "fill", {}});
  q.put({Tensor(), 0, 0, "fill", {}});
  const std::size_t free_full = detail::job_arena().free_bytes();
  EXPECT_THROW(q.put({Tensor(), 0, 0, payload, {Tensor::empty_shared({8}, DType::f32)}}, 20ms), TimeoutError);
  EXPECT_EQ(detail::job_arena().free_bytes(), free_full);
  while (q.try_get()) {
  }
}

TEST(TensorQueue, AReceivedTensorCanBePutOnAnotherQueue) {
  TensorQueue a = TensorQueue::open("unit.a", 2), b = TensorQueue::open("unit.b", 2);
  Tensor t = Tensor::empty_shared({16}, DType::f32);
  std::memset(t.data(), 0x3f, t.nbytes());
  a.put(t);
  b.put(a.get()->tensor);
  Tensor back = b.get()->tensor;
  EXPECT_EQ(back.data(), t.data());
  EXPECT_TRUE(back.equal(t));
}

TEST(Barrier, ATimedOutArrivalIsTakenBack) {
  Barrier barrier = Barrier::open("unit.barrier", 2);
  EXPECT_THROW(barrier.wait(30ms), TimeoutError);
  // Had the first arrival stayed counted, this lone wait would pass the barrier.
  EXPECT_THROW(barrier.wait(30ms), TimeoutError);
  std::thread other([&] { barrier.wait(5s); });
  EXPECT_NO_THROW(barrier.wait(5s));
  other.join();
  EXPECT_THROW(Barrier::open("unit.barrier", 3), UsageError);
}

TEST(Sync, LockValueArrayAndEvent) {
  Value<std::int64_t> counter = Value<std::int64_t>::open("unit.counter", 5);
  std::thread a([&] {
    for (int i = 0; i < 10000; ++i) counter.update([](std::int64_t& v) { ++v; });
  });
  for (int i = 0; i < 10000; ++i) counter.update([](std::int64_t& v) { ++v; });
  a.join();
  EXPECT_EQ(counter.get(), 20005);

  Array<double> array = Array<double>::open("unit.array", 8);
  EXPECT_EQ(array.size(), 8u);
  for (double v : array.data()) EXPECT_EQ(v, 0.0);
  EXPECT_THROW(Array<double>::open("unit.array", 9), UsageError);

  Lock lock = Lock::open("unit.lock");
  lock.lock();
  EXPECT_FALSE(lock.try_lock());
  std::thread waiter([&] { EXPECT_THROW(Lock::open("unit.lock").lock(30ms), TimeoutError); });
  waiter.join();
  lock.unlock();
  EXPECT_THROW(lock.unlock(), UsageError);

  Event event = Event::open("unit.event");
  EXPECT_THROW(event.wait(20ms), TimeoutError);
  std::thread setter([&] { event.set(); });
  event.wait(5s);
  setter.join();
  EXPECT_TRUE(event.is_set());
  event.clear();
  EXPECT_FALSE(event.is_set());
}

}  // namespace
}  // namespace nodal
