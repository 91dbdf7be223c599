// RLock, Semaphore, BoundedSemaphore and Condition (multiprocessing's), within one process
// (threads stand in for processes) and across fork()ed children, including a holder that dies.
#include <gtest/gtest.h>

#include <nodal/condition.hpp>
#include <nodal/errors.hpp>
#include <nodal/semaphore.hpp>
#include <nodal/sync.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

namespace nodal {
namespace {

using namespace std::chrono_literals;

/// Runs `body` in a fork()ed child that then _exits with its result; returns the child's pid.
template <class Body>
pid_t fork_child(Body&& body) {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(body());
  return pid;
}

int wait_exit_code(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(RLock, TheHolderTakesItAgainOthersWait) {
  RLock lock = RLock::open("unit.rlock");
  lock.acquire();
  lock.acquire();
  EXPECT_EQ(lock.held_by_me(), 2);
  std::thread other([&] {
    RLock same = RLock::open("unit.rlock");
    EXPECT_FALSE(same.try_acquire());
    EXPECT_THROW(same.acquire(30ms), TimeoutError);
    EXPECT_THROW(same.release(), UsageError);
  });
  other.join();
  lock.release();
  std::thread still_held([&] { EXPECT_FALSE(RLock::open("unit.rlock").try_acquire()); });
  still_held.join();
  lock.release();
  EXPECT_EQ(lock.held_by_me(), 0);
  std::thread now_free([&] {
    RLock same = RLock::open("unit.rlock");
    EXPECT_TRUE(same.try_acquire());
    same.release();
  });
  now_free.join();
  EXPECT_THROW(lock.release(), UsageError);
}

TEST(RLock, AHolderThatDiesIsAnErrorNotADeadlock) {
  RLock lock = RLock::open("unit.rlock.dead");
  const pid_t child = fork_child([&] {
    lock.acquire();
    return 0;  // exits holding it
  });
  ASSERT_EQ(wait_exit_code(child), 0);
  const auto start = std::chrono::steady_clock::now();
  try {
    lock.acquire(10s);
    FAIL() << "acquired a lock its dead holder never released";
  } catch (const PeerFailure& e) {
    EXPECT_NE(std::string(e.what()).find("(pid " + std::to_string(child) + ") died"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
}

TEST(Semaphore, CountsUnitsAndWakesAWaiter) {
  Semaphore sem = Semaphore::open("unit.sem", 2);
  EXPECT_EQ(sem.value(), 2);
  sem.acquire();
  EXPECT_TRUE(sem.try_acquire());
  EXPECT_FALSE(sem.try_acquire());
  EXPECT_THROW(sem.acquire(20ms), TimeoutError);
  std::atomic<bool> got{false};
  std::thread waiter([&] {
    Semaphore::open("unit.sem", 2).acquire(5s);
    got = true;
  });
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(got);
  sem.release();
  waiter.join();
  EXPECT_TRUE(got);
  sem.release(2);
  EXPECT_EQ(sem.value(), 2);
  EXPECT_THROW(sem.release(0), UsageError);
  EXPECT_THROW(BoundedSemaphore::open("unit.sem", 2), UsageError) << "exists unbounded";
  EXPECT_THROW(Semaphore::open("unit.sem.negative", -1), UsageError);
}

TEST(Semaphore, ProducerReleasesConsumerAcquires) {
  // The signalling pattern: one side only releases, the other only acquires.
  Semaphore items = Semaphore::open("unit.sem.items", 0);
  std::thread consumer([] {
    Semaphore mine = Semaphore::open("unit.sem.items", 0);
    for (int i = 0; i < 1000; ++i) mine.acquire(5s);
  });
  for (int i = 0; i < 1000; ++i) items.release();
  consumer.join();
  EXPECT_EQ(items.value(), 0);
}

TEST(BoundedSemaphore, ReleasingAboveTheBoundIsAnError) {
  BoundedSemaphore sem = BoundedSemaphore::open("unit.bsem", 1);
  EXPECT_THROW(sem.release(), UsageError);
  sem.acquire();
  sem.release();
  EXPECT_EQ(sem.value(), 1);
  EXPECT_THROW(BoundedSemaphore::open("unit.bsem", 3), UsageError) << "exists with another bound";
  EXPECT_THROW(Semaphore::open("unit.bsem", 1), UsageError) << "exists bounded";
}

TEST(Semaphore, AHolderThatDiesIsAnErrorNotADeadlock) {
  Semaphore sem = Semaphore::open("unit.sem.dead", 1);
  const pid_t child = fork_child([&] {
    sem.acquire();
    return 0;
  });
  ASSERT_EQ(wait_exit_code(child), 0);
  EXPECT_EQ(sem.value(), 0);
  const auto start = std::chrono::steady_clock::now();
  try {
    sem.acquire(10s);
    FAIL() << "acquired a unit its dead holder never released";
  } catch (const PeerFailure& e) {
    EXPECT_NE(std::string(e.what()).find("semaphore 'unit.sem.dead' (pid " + std::to_string(child) + ") died"),
              std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
}

TEST(Condition, WaitForSeesTheNotifiedState) {
  Condition cond = Condition::open("unit.cond");
  Value<int> stage = Value<int>::open("unit.cond.stage", 0);
  std::thread worker([&] {
    Condition mine = Condition::open("unit.cond");
    mine.acquire();
    EXPECT_TRUE(mine.wait_for([&] { return stage.get() == 1; }, 5s));
    stage.set(2);
    mine.notify_all();
    mine.release();
  });
  std::this_thread::sleep_for(20ms);
  const auto start = std::chrono::steady_clock::now();
  cond.acquire();
  stage.set(1);
  cond.notify();
  // The notifier waits next: it must not take the wake-up meant for the worker (then both
  // would sit out their 5 s).
  EXPECT_TRUE(cond.wait_for([&] { return stage.get() == 2; }, 5s));
  cond.release();
  worker.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);
}

TEST(Condition, ATimedOutWaiterDoesNotSpendALaterNotify) {
  Condition cond = Condition::open("unit.cond.cancel");
  cond.acquire();
  EXPECT_FALSE(cond.wait(10ms));  // times out: its ticket is cancelled
  cond.release();
  std::atomic<bool> woken{false};
  std::thread waiter([&] {
    Condition mine = Condition::open("unit.cond.cancel");
    mine.acquire();
    woken = mine.wait(5s);
    mine.release();
  });
  std::this_thread::sleep_for(100ms);
  const auto start = std::chrono::steady_clock::now();
  cond.acquire();
  cond.notify(1);
  cond.release();
  waiter.join();
  EXPECT_TRUE(woken);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);
}

TEST(Condition, NotifyWakesAtMostNWaiters) {
  Condition cond = Condition::open("unit.cond.n");
  std::atomic<int> woken{0};
  auto wait_once = [&] {
    Condition mine = Condition::open("unit.cond.n");
    mine.acquire();
    if (mine.wait(5s)) ++woken;
    mine.release();
  };
  std::thread a(wait_once), b(wait_once);
  // Both must be waiting before the notify counts them: give them the time to get there.
  std::this_thread::sleep_for(200ms);
  cond.acquire();
  cond.notify(1);
  cond.release();
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(woken.load(), 1) << "notify(1) must wake one of two waiters";
  cond.acquire();
  cond.notify_all();
  cond.release();
  a.join();
  b.join();
  EXPECT_EQ(woken.load(), 2);
}

TEST(Condition, TimeoutsAndMisuse) {
  Condition cond = Condition::open("unit.cond.misuse");
  EXPECT_THROW(cond.wait(10ms), UsageError) << "waiting without the lock";
  EXPECT_THROW(cond.notify(), UsageError) << "notifying without the lock";
  cond.acquire();
  cond.acquire();  // recursive: wait releases both levels and takes both back
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(cond.wait(30ms));
  EXPECT_GE(std::chrono::steady_clock::now() - start, 30ms);
  EXPECT_EQ(cond.get_lock().held_by_me(), 2);
  EXPECT_FALSE(cond.wait_for([] { return false; }, 20ms));
  cond.release();
  cond.release();
}

TEST(Condition, AcrossProcesses) {
  Condition cond = Condition::open("unit.cond.fork");
  Value<int> ready = Value<int>::open("unit.cond.fork.ready", 0);
  const pid_t child = fork_child([&] {
    Condition mine = Condition::open("unit.cond.fork");
    mine.acquire();
    ready.set(1);
    mine.notify_all();
    const bool ok = mine.wait_for([&] { return ready.get() == 2; }, 10s);
    mine.release();
    return ok ? 0 : 1;
  });
  cond.acquire();
  ASSERT_TRUE(cond.wait_for([&] { return ready.get() == 1; }, 10s));
  ready.set(2);
  cond.notify_all();
  cond.release();
  EXPECT_EQ(wait_exit_code(child), 0);
}

}  // namespace
}  // namespace nodal
