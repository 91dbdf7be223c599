// Process-shared synchronisation, like Python's multiprocessing Lock, Event, Barrier, Value and
// Array: named objects in the job's shared arena that every rank opens by name. Every wait goes
// through the one waiting helper (spin, yield when oversubscribed, futex) and throws
// nodal::PeerFailure when the job has failed, nodal::TimeoutError when its timeout passes.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <type_traits>

namespace nodal {

namespace detail {
struct LockState;
struct RLockState;
struct EventState;
struct BarrierState;
/// The shared block behind a Value or an Array: a lock, then `bytes` of data.
void* open_locked_block(const std::string& kind, const std::string& name, std::size_t bytes, const void* initial,
                        LockState** lock);
}  // namespace detail

using Timeout = std::optional<std::chrono::nanoseconds>;

/// A mutual-exclusion lock shared by the processes of a job (multiprocessing.Lock).
/// If the process holding it dies, waiters throw PeerFailure instead of waiting forever.
class Lock {
 public:
  /// The job's lock called `name`, created unlocked by the first opener. Throws ShmError.
  static Lock open(const std::string& name);
  /// Throws TimeoutError after `timeout`, PeerFailure if the job failed or the holder died.
  void lock(Timeout timeout = std::nullopt);
  bool try_lock();
  /// Throws UsageError when this process does not hold the lock.
  void unlock();

  explicit Lock(detail::LockState* state) : state_(state) {}

 private:
  detail::LockState* state_;
};

/// A recursive lock shared by the processes of a job (multiprocessing.RLock): the thread holding
/// it may take it again, and must release it as many times. If the holder dies, waiters throw
/// PeerFailure instead of waiting forever.
class RLock {
 public:
  /// The job's recursive lock called `name`, created free by the first opener. Throws ShmError.
  static RLock open(const std::string& name);
  /// Throws TimeoutError after `timeout`, PeerFailure if the job failed or the holder died.
  void acquire(Timeout timeout = std::nullopt);
  bool try_acquire();
  /// Throws UsageError when this thread does not hold the lock.
  void release();
  /// Whether the calling thread holds it, and how many times.
  int held_by_me() const;

  explicit RLock(detail::RLockState* state) : state_(state) {}

 private:
  friend class Condition;
  detail::RLockState* state_;
};

/// A flag processes wait for (multiprocessing.Event).
class Event {
 public:
  static Event open(const std::string& name);
  void set();
  void clear();
  bool is_set() const;
  /// Returns when the flag is set. Throws TimeoutError, PeerFailure.
  void wait(Timeout timeout = std::nullopt);

 private:
  explicit Event(detail::EventState* state) : state_(state) {}
  detail::EventState* state_;
};

/// A reusable barrier for `parties` processes, any subset of the ranks (multiprocessing.Barrier).
class Barrier {
 public:
  /// Throws UsageError when the barrier exists with another number of parties.
  static Barrier open(const std::string& name, int parties);
  /// Returns when `parties` processes have called wait() for this round. Throws TimeoutError,
  /// PeerFailure.
  void wait(Timeout timeout = std::nullopt);
  int parties() const;

 private:
  explicit Barrier(detail::BarrierState* state) : state_(state) {}
  detail::BarrierState* state_;
};

/// One T in shared memory with its lock (multiprocessing.Value). T: trivially copyable.
template <class T>
class Value {
  static_assert(std::is_trivially_copyable_v<T>, "a shared Value holds plain bytes");

 public:
  /// The job's Value called `name`; the first opener stores `initial`.
  static Value open(const std::string& name, T initial = T{}) {
    detail::LockState* lock = nullptr;
    void* data = detail::open_locked_block("value", name, sizeof(T), &initial, &lock);
    return Value(static_cast<T*>(data), lock);
  }
  T get() {
    lock_.lock();
    T value;
    std::memcpy(&value, data_, sizeof(T));
    lock_.unlock();
    return value;
  }
  void set(const T& value) {
    lock_.lock();
    std::memcpy(data_, &value, sizeof(T));
    lock_.unlock();
  }
  /// Applies f(T&) under the lock and returns the new value: v.update([](int& x) { x += 1; }).
  template <class F>
  T update(F&& f) {
    lock_.lock();
    try {
      f(*data_);
    } catch (...) {
      lock_.unlock();
      throw;
    }
    T value = *data_;
    lock_.unlock();
    return value;
  }
  Lock& get_lock() { return lock_; }

 private:
  Value(T* data, detail::LockState* lock) : data_(data), lock_(lock) {}
  T* data_;
  Lock lock_;
};

/// `length` Ts in shared memory with one lock (multiprocessing.Array), zero-initialised.
template <class T>
class Array {
  static_assert(std::is_trivially_copyable_v<T>, "a shared Array holds plain bytes");

 public:
  /// Throws UsageError when the array exists with another length.
  static Array open(const std::string& name, std::size_t length) {
    detail::LockState* lock = nullptr;
    void* data = detail::open_locked_block("array", name, length * sizeof(T), nullptr, &lock);
    return Array(static_cast<T*>(data), length, lock);
  }
  std::size_t size() const { return length_; }
  /// The elements, unlocked: take get_lock() around read-modify-write sequences.
  std::span<T> data() const { return {data_, length_}; }
  T& operator[](std::size_t i) const { return data_[i]; }
  Lock& get_lock() { return lock_; }

 private:
  Array(T* data, std::size_t length, detail::LockState* lock) : data_(data), length_(length), lock_(lock) {}
  T* data_;
  std::size_t length_;
  Lock lock_;
};

}  // namespace nodal
