// Rank program of tests/integration/nonblocking_test.cpp: the non-blocking collectives (Work).
//   nonblocking_program results     every i-call, several in flight, interleaved with blocking
//                                   calls, checked against values computed here; prints
//                                   "rank R: N checks ok"; Work::on_completion's callbacks run
//                                   once, after the result is in place
//   nonblocking_program mismatch    rank 0 iallreduce, the others ibroadcast: UsageError from wait
//                                   on every rank, and the communicator works afterwards
//   nonblocking_program timeout     rank 1 joins 600 ms late: rank 0's wait(50 ms) is a
//                                   TimeoutError, then wait() completes
//   nonblocking_program bad_args    a shape error is thrown by the i-call itself; spawn(fork)
//                                   after an i-call is refused, naming the progress thread
//   nonblocking_program peer_dies   the last rank SIGKILLs itself; the others' wait gives PeerFailure
#include <nodal/communicator.hpp>
#include <nodal/errors.hpp>
#include <nodal/nodal.hpp>
#include <nodal/spawn.hpp>
#include <nodal/work.hpp>

#include "../support/rank_checks.hpp"

#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace {

using nodal::DType;
using nodal::ReduceOp;
using nodal::Tensor;
using nodal::Work;

using nodal::testing::expect;
using nodal::testing::fail;
using nodal::testing::g_checks;

Tensor filled(std::int64_t n, float base) {
  Tensor t = Tensor::empty({n}, DType::f32);
  for (std::int64_t i = 0; i < n; ++i) t.data_ptr<float>()[i] = base + static_cast<float>(i % 1000);
  return t;
}

/// Every i-call at two sizes (the small and the pipelined path), several in flight at once, with
/// blocking calls between them: each result against its closed form.
int results(nodal::Communicator& comm) {
  const int n = comm.world_size(), r = comm.rank();
  const auto nf = static_cast<float>(n);
  for (std::int64_t count : {std::int64_t{5}, std::int64_t{300000}}) {
    const auto at = [](std::int64_t i) { return static_cast<float>(i % 1000); };
    Tensor a = filled(count, static_cast<float>(r));         // allreduce: sum over ranks
    Tensor b = filled(count, static_cast<float>(10 * r));    // broadcast from the last rank
    Tensor c = filled(count, static_cast<float>(r + 1));     // allgather
    Tensor c_out = Tensor::empty({count * n}, DType::f32);
    Tensor d = filled(count * n, static_cast<float>(r));     // reduce_scatter
    Tensor d_out = Tensor::empty({count}, DType::f32);
    Tensor e = filled(count * n, static_cast<float>(100 * r));  // alltoall
    Tensor e_out = Tensor::empty({count * n}, DType::f32);
    Tensor g_out = Tensor::empty({count * n}, DType::f32);     // gather to rank 0 (of c)
    Tensor s_out = Tensor::empty({count}, DType::f32);         // scatter from rank 0 (of d)
    Tensor blocking = filled(count, 1.0F);

    std::vector<Work> works;
    works.push_back(comm.iallreduce(a));
    const float first = static_cast<float>(n * (n - 1) / 2);
    std::atomic<int> fired{0};
    std::atomic<bool> in_place{false};
    works.back().on_completion([&] {
      in_place = a.data_ptr<float>()[0] == first;
      fired.fetch_add(1);
    });
    works.push_back(comm.ibroadcast(b, n - 1));
    comm.allreduce(blocking);  // blocking between non-blocking ones: queued in order
    works.push_back(comm.iallgather(c, c_out));
    works.push_back(comm.ireduce_scatter(d, d_out));
    works.push_back(comm.ialltoall(e, e_out));
    works.push_back(comm.igather(c, g_out, 0));
    works.push_back(comm.iscatter(d, s_out, 0));
    works.push_back(comm.ibarrier());
    for (Work& w : works) w.wait();
    for (Work& w : works) expect(w.is_completed() && w.test(), "a waited Work is completed");
    // The callback runs right after the call is marked done: give it a moment.
    for (int spin = 0; fired.load() == 0 && spin < 20000; ++spin) std::this_thread::sleep_for(std::chrono::microseconds(50));
    expect(fired.load() == 1 && in_place.load(), "on_completion ran once, after the result was in place");
    const auto caller = std::this_thread::get_id();
    bool here = false;
    works.back().on_completion([&] { here = std::this_thread::get_id() == caller; });
    expect(here, "on_completion of a finished call runs at once, on the calling thread");

    const float rank_sum = static_cast<float>(n * (n - 1) / 2);
    for (std::int64_t i = 0; i < count; ++i) {
      expect(a.data_ptr<float>()[i] == rank_sum + nf * at(i), "iallreduce at " + std::to_string(i));
      expect(b.data_ptr<float>()[i] == 10.0F * static_cast<float>(n - 1) + at(i), "ibroadcast at " + std::to_string(i));
      expect(blocking.data_ptr<float>()[i] == nf * (1.0F + at(i)), "the blocking allreduce at " + std::to_string(i));
      // reduce_scatter: block r of sum over ranks of (rank + at(r * count + i)).
      expect(d_out.data_ptr<float>()[i] == rank_sum + nf * at(r * count + i), "ireduce_scatter at " + std::to_string(i));
      expect(s_out.data_ptr<float>()[i] == at(r * count + i), "iscatter at " + std::to_string(i));
      if (i > 50) i += 997;  // the rest sparsely: the checks cost more than the calls
    }
    for (int j = 0; j < n; ++j) {
      for (std::int64_t i : {std::int64_t{0}, count - 1}) {
        expect(c_out.data_ptr<float>()[j * count + i] == static_cast<float>(j + 1) + at(i), "iallgather");
        // alltoall: block j of my output is block r of rank j's input.
        expect(e_out.data_ptr<float>()[j * count + i] == 100.0F * static_cast<float>(j) + at(r * count + i), "ialltoall");
        if (r == 0) expect(g_out.data_ptr<float>()[j * count + i] == static_cast<float>(j + 1) + at(i), "igather");
      }
    }
  }
  expect(Work().is_completed() && Work().test(), "a default Work is completed");
  std::printf("rank %d: %ld checks ok\n", r, g_checks);
  return 0;
}

int mismatch_then_usable(nodal::Communicator& comm) {
  Tensor t = filled(8, 1.0F);
  Work w = comm.rank() == 0 ? comm.iallreduce(t) : comm.ibroadcast(t, 0);
  bool threw = false;
  try {
    w.wait();
  } catch (const nodal::UsageError& e) {
    threw = true;
    std::printf("rank %d: UsageError from wait: %s\n", comm.rank(), e.what());
  }
  expect(threw, "wait rethrows the mismatch");
  bool test_threw = false;
  try {
    (void)w.test();
  } catch (const nodal::UsageError&) {
    test_threw = true;
  }
  expect(test_threw, "test rethrows it too");
  bool failed_seen = false;
  w.on_completion([&] {
    try {
      (void)w.test();
    } catch (const nodal::UsageError&) {
      failed_seen = true;
    }
  });
  expect(failed_seen, "on_completion runs for a call that failed, whose test() rethrows");
  Tensor u = filled(8, 1.0F);
  comm.iallreduce(u).wait();
  expect(u.data_ptr<float>()[3] == static_cast<float>(comm.world_size()) * 4.0F, "the communicator works after the mismatch");
  std::printf("rank %d: usable after the mismatch\n", comm.rank());
  return 0;
}

int timeout(nodal::Communicator& comm) {
  Tensor t = filled(8, 1.0F);
  if (comm.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(600));
  Work w = comm.iallreduce(t);
  if (comm.rank() == 0) {
    expect(!w.is_completed(), "not completed while rank 1 is away");
    try {
      w.wait(std::chrono::milliseconds(50));
      fail("no TimeoutError");
    } catch (const nodal::TimeoutError& e) {
      std::printf("rank 0: TimeoutError: %s\n", e.what());
    }
  }
  w.wait();
  expect(t.data_ptr<float>()[0] == static_cast<float>(comm.world_size()) * 1.0F, "completed after the timeout");
  std::printf("rank %d: completed after all\n", comm.rank());
  return 0;
}

int bad_args(nodal::Communicator& comm) {
  Tensor in = filled(8, 1.0F);
  Tensor out = Tensor::empty({7}, DType::f32);
  try {
    (void)comm.iallgather(in, out);
    fail("no UsageError from the i-call");
  } catch (const nodal::UsageError& e) {
    std::printf("rank %d: UsageError at once: %s\n", comm.rank(), e.what());
  }
  // From the first i-call on, the communicator has a thread: fork is refused, saying so.
  comm.ibarrier().wait();
  try {
    nodal::spawn([](int) {}, 1, {.start_method = nodal::StartMethod::fork});
    fail("spawn(fork) with the progress thread running was not refused");
  } catch (const nodal::UsageError& e) {
    std::printf("rank %d: spawn(fork) refused: %s\n", comm.rank(), e.what());
  }
  return 0;
}

int peer_dies(nodal::Communicator& comm) {
  const int n = comm.world_size(), r = comm.rank();
  Tensor t = filled(1 << 20, 1.0F);
  comm.allreduce(t);  // every rank is in the job
  if (r == n - 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ::raise(SIGKILL);
  }
  ::signal(SIGTERM, SIG_IGN);  // PeerFailure, not nodalrun's SIGTERM, must end the survivors
  Work w = comm.iallreduce(t);
  try {
    w.wait();
    fail("no PeerFailure");
  } catch (const nodal::PeerFailure& e) {
    std::printf("rank %d: PeerFailure from wait\n", r);
    std::fflush(stdout);
  }
  std::_Exit(0);
}

}  // namespace

int main(int argc, char** argv) {
  return nodal::testing::run_mode(argc, argv, "nonblocking_program", {{"results", results},
{"mismatch", mismatch_then_usable},
{"timeout", timeout},
{"bad_args", bad_args},
{"peer_dies", peer_dies}});
}
