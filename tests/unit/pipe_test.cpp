// nodal::Pipe (multiprocessing.Pipe): bytes, values and tensors both ways, one-way pipes, close
// and EndOfStream, poll, a dead peer, and pipes opened by name; across threads and fork()ed children.
#include <gtest/gtest.h>

#include <nodal/errors.hpp>
#include <nodal/pipe.hpp>
#include <nodal/tensor.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

namespace nodal {
namespace {

using namespace std::chrono_literals;

int wait_exit_code(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(Pipe, BytesValuesAndTensorsBothWaysBetweenProcesses) {
  auto [parent, child_end] = Pipe();
  Tensor shared = Tensor::empty_shared({1024}, DType::f32);
  for (int i = 0; i < 1024; ++i) shared.data_ptr<float>()[i] = static_cast<float>(i);
  const pid_t child = ::fork();
  if (child == 0) {
    // Echo everything back, changed so that the parent can tell.
    int code = 0;
    try {
      std::string bytes = child_end.recv_bytes(10s);
      child_end.send_bytes(bytes + "!");
      const double x = child_end.recv<double>(10s);
      child_end.send(x * 2);
      Tensor t = child_end.recv_tensor(10s);
      t.data_ptr<float>()[0] = -1.0F;  // the parent's storage: a handle, not a copy
      child_end.send_tensor(t);
      child_end.send_bytes(std::string(3 << 20, 'z'));
    } catch (...) {
      code = 1;
    }
    ::_exit(code);
  }
  parent.send_bytes(std::string("hello\0world", 11));
  EXPECT_EQ(parent.recv_bytes(10s), std::string("hello\0world!", 12));
  parent.send(21.5);
  EXPECT_EQ(parent.recv<double>(10s), 43.0);
  parent.send_tensor(shared);
  Tensor back = parent.recv_tensor(10s);
  EXPECT_EQ(back.data(), shared.data()) << "the tensor travelled by handle";
  EXPECT_EQ(shared.data_ptr<float>()[0], -1.0F) << "the child wrote into the parent's shared tensor";
  EXPECT_EQ(parent.recv_bytes(10s), std::string(3 << 20, 'z'));
  EXPECT_EQ(wait_exit_code(child), 0);
}

TEST(Pipe, OneWayPipesAndMisuse) {
  auto [reader, writer] = Pipe(/*duplex=*/false);
  EXPECT_TRUE(reader.readable());
  EXPECT_FALSE(reader.writable());
  EXPECT_FALSE(writer.readable());
  EXPECT_THROW(reader.send_bytes("x"), UsageError);
  EXPECT_THROW(writer.recv_bytes(10ms), UsageError);
  writer.send(std::int32_t{7});
  EXPECT_THROW(reader.recv<std::int64_t>(1s), UsageError) << "the sizes differ";
  writer.send_tensor(Tensor::empty({2}, DType::f32));
  EXPECT_THROW(reader.recv_bytes(1s), UsageError) << "the next message is a tensor";
}

TEST(Pipe, CloseEndsTheStreamAfterWhatWasSent) {
  auto [a, b] = Pipe();
  a.send_bytes("one");
  a.send_bytes("two");
  a.close();
  EXPECT_TRUE(a.closed());
  EXPECT_FALSE(b.closed());
  EXPECT_THROW(a.send_bytes("x"), UsageError) << "this end is closed";
  EXPECT_EQ(b.recv_bytes(1s), "one");
  EXPECT_TRUE(b.poll());
  EXPECT_EQ(b.recv_bytes(1s), "two");
  EXPECT_TRUE(b.poll()) << "the end of the stream is there to receive";
  EXPECT_THROW(b.recv_bytes(1s), EndOfStream);
  EXPECT_THROW(b.send_bytes("late"), EndOfStream) << "the other end closed";
}

TEST(Pipe, PollWaitsForAMessage) {
  auto [a, b] = Pipe();
  EXPECT_FALSE(b.poll());
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(b.poll(30ms));
  EXPECT_GE(std::chrono::steady_clock::now() - start, 30ms);
  std::thread sender([&] {
    std::this_thread::sleep_for(30ms);
    a.send_bytes("now");
  });
  EXPECT_TRUE(b.poll(5s));
  sender.join();
  EXPECT_EQ(b.recv_bytes(), "now");
  EXPECT_THROW(b.recv_bytes(20ms), TimeoutError);
}

TEST(Pipe, ADeadPeerIsPeerFailureNotAHang) {
  auto [parent, child_end] = Pipe();
  const pid_t child = ::fork();
  if (child == 0) {
    child_end.send_bytes("last words");  // the end is the child's from here
    ::_exit(0);
  }
  ASSERT_EQ(wait_exit_code(child), 0);
  EXPECT_EQ(parent.recv_bytes(5s), "last words");
  const auto start = std::chrono::steady_clock::now();
  try {
    parent.recv_bytes(10s);
    FAIL() << "received from a dead process";
  } catch (const PeerFailure& e) {
    EXPECT_NE(std::string(e.what()).find("(pid " + std::to_string(child) + ") died"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);
  EXPECT_THROW(parent.poll(10s), PeerFailure);
}

TEST(Pipe, RanksOpenAPipeByName) {
  std::thread rank1([] {
    Connection mine = open_pipe("unit.named").second;
    mine.send(std::int64_t{42});
    EXPECT_EQ(mine.recv_bytes(5s), "thanks");
  });
  Connection mine = open_pipe("unit.named").first;
  EXPECT_EQ(mine.recv<std::int64_t>(5s), 42);
  mine.send_bytes("thanks");
  rank1.join();
  EXPECT_THROW(open_pipe("unit.named", /*duplex=*/false), UsageError);
}

}  // namespace
}  // namespace nodal
