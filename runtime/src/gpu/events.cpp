// Stream order between a producer and its consumers (gpu.hpp "Queue hand-off"): each rank has a
// pool of interprocess events (cudaEventDisableTiming | cudaEventInterprocess). put() records
// one on the producer's stream; get() makes the consumer's stream wait for it. Opening an event
// handle costs ~240 us (DESIGN.md "GPU facts"), so events are reused: each slot's handle is
// published in the arena once and opened once per consumer process, and a slot is recorded again
// only after the consumer has queued its wait (the slot's state goes back to free then).
//
// A producer that exits waits for its recorded events and marks them done, so a consumer that
// gets the tensor later skips the wait (the event dies with the producer: using an imported
// event after its exporter destroyed it is undefined behaviour). The race between a consumer's
// "not done yet, wait on it" and the producer exiting right then is closed in the arena, not by
// a mutex (the two are different processes): the consumer claims the slot (recorded -> waiting)
// before it opens the handle and queues its wait, and the exiting producer waits (bounded, see
// finish_events_at_exit) for a waiting slot to go free before it exits.
#include "common.hpp"
#include "driver.hpp"

#include <nodal/arena.hpp>
#include <nodal/errors.hpp>
#include <nodal/detail/storage.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include <fmt/format.h>

namespace nodal::detail::gpu {
namespace {

constexpr int kSlots = 64;

enum SlotState : std::uint32_t {
  kFree = 0,      ///< the owner may record it
  kRecorded = 1,  ///< recorded for a wire; a consumer will wait on it
  kDone = 2,      ///< recorded, and the owner has seen it complete (it is exiting): no wait needed
  kWaiting = 3,   ///< a consumer is opening the event or queuing its wait (its owner must not exit)
};

/// How long an exiting producer waits for its recorded events to complete and for consumers
/// that are queuing their waits.
constexpr auto kExitWait = std::chrono::seconds(10);

/// One event slot as every process sees it.
struct alignas(64) EventSlot {
  std::atomic<std::uint32_t> state{kFree};
  std::atomic<std::uint32_t> published{0};  ///< `handle` and `device` are valid
  std::int32_t device = -1;
  std::atomic<std::uint64_t> generation{0};  ///< bumped on every record (a consistency check)
  cudaIpcEventHandle_t handle{};
};

/// One rank's slots, in the arena under "gpu:events:<rank>".
struct EventTable {
  EventSlot slots[kSlots];
};

/// Rank `rank`'s table; the arena lookup (a named object, under the arena's lock) is done once
/// per rank and process.
EventTable& table_of(int rank) {
  static std::mutex mutex;
  static auto* tables = new std::map<int, EventTable*>;
  std::lock_guard lock(mutex);
  EventTable*& table = (*tables)[rank];
  if (table == nullptr) {
    std::string name = fmt::format("gpu:events:{}", rank);
    table = &job_arena().find_or_construct<EventTable>(name.c_str());
  }
  return *table;
}

struct Events {
  std::mutex mutex;
  EventTable* own = nullptr;
  cudaEvent_t local[kSlots] = {};  ///< this rank's events, created on first use of a slot
  std::map<std::pair<int, int>, cudaEvent_t> opened;  ///< (owner, slot) -> opened handle
  bool exit_hook = false;
};

/// Never destroyed (used from exit handlers).
Events& events() {
  static auto* e = new Events;
  return *e;
}

/// At exit: the events this rank recorded that nobody has waited for yet are waited for here and
/// marked done, so consumers that get our tensors after we are gone need not open an event of a
/// process that no longer exists; a slot a consumer is waiting on (kWaiting) is let go free
/// first. Polled (cudaEventQuery) and bounded: it gives up at kExitWait or once the job has
/// failed (an event behind a wait on a dead rank may never complete). Registered after the CUDA
/// runtime started, so it runs before the runtime's own teardown. An atexit handler: nothing may
/// escape it.
void finish_events_at_exit() noexcept {
  try {
    Events& e = events();
    std::lock_guard lock(e.mutex);
    if (e.own == nullptr) return;
    const auto deadline = std::chrono::steady_clock::now() + kExitWait;
    int abandoned = 0;
    for (int s = 0; s < kSlots; ++s) {
      EventSlot& slot = e.own->slots[s];
      if (e.local[s] == nullptr) continue;
      for (;;) {
        std::uint32_t state = slot.state.load(std::memory_order_acquire);
        if (state == kFree || state == kDone) break;
        if (state == kRecorded) {
          const cudaError_t result = cudaEventQuery(e.local[s]);
          if (result == cudaSuccess) {
            // Fails only when a consumer claimed it meanwhile: look again.
            if (slot.state.compare_exchange_strong(state, kDone, std::memory_order_acq_rel)) break;
            continue;
          }
          if (result != cudaErrorNotReady) {
            (void)cudaGetLastError();
            ++abandoned;
            break;
          }
        }
        // Not complete yet, or a consumer is queuing its wait on it.
        if (job_failed() || std::chrono::steady_clock::now() >= deadline) {
          ++abandoned;
          break;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
    if (abandoned > 0) {
      std::fprintf(stderr,
                   "nodal: rank %d exits with %d interprocess CUDA event(s) of queued tensors not finished; "
                   "their consumers may fail to open them\n",
                   self().rank, abandoned);
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "nodal: at exit, finishing interprocess CUDA events failed: %s\n", error.what());
  } catch (...) {
    std::fprintf(stderr, "nodal: at exit, finishing interprocess CUDA events failed\n");
  }
}

/// Makes slot `s` of this rank usable on `device`: the event, its handle in the arena.
void create_slot(Events& e, int s, int device) {
  cudaEvent_t event = nullptr;
  check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming | cudaEventInterprocess),
        "cudaEventCreateWithFlags(interprocess)");
  EventSlot& slot = e.own->slots[s];
  cudaError_t result = cudaIpcGetEventHandle(&slot.handle, event);
  if (result != cudaSuccess) {
    (void)cudaEventDestroy(event);
    check(result, "cudaIpcGetEventHandle");
  }
  slot.device = device;
  slot.published.store(1, std::memory_order_release);
  e.local[s] = event;
  if (!e.exit_hook) {
    e.exit_hook = true;
    std::atexit(finish_events_at_exit);
  }
}

}  // namespace

void record_event(int device, cuda::Stream stream, WireTensor& wire) {
  Events& e = events();
  std::lock_guard lock(e.mutex);
  if (e.own == nullptr) e.own = &table_of(self().rank);
  // A slot already made for this device, else a new one.
  int chosen = -1;
  for (int pass = 0; pass < 2 && chosen < 0; ++pass) {
    for (int s = 0; s < kSlots; ++s) {
      EventSlot& slot = e.own->slots[s];
      bool made = e.local[s] != nullptr;
      if (pass == 0 ? !(made && slot.device == device) : made) continue;
      std::uint32_t expected = kFree;
      if (slot.state.load(std::memory_order_acquire) != kFree ||
          !slot.state.compare_exchange_strong(expected, kRecorded, std::memory_order_acq_rel)) {
        continue;
      }
      chosen = s;
      break;
    }
  }
  if (chosen < 0) {
    // Every slot awaits a consumer: order by waiting here instead (slower, always correct).
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (no free interprocess event)");
    wire.event_owner = -1;
    return;
  }
  EventSlot& slot = e.own->slots[chosen];
  try {
    if (e.local[chosen] == nullptr) create_slot(e, chosen, device);
    check(cudaEventRecord(e.local[chosen], stream), "cudaEventRecord");
  } catch (...) {
    slot.state.store(kFree, std::memory_order_release);
    throw;
  }
  wire.event_owner = self().rank;
  wire.event_slot = chosen;
  wire.event_generation = slot.generation.fetch_add(1, std::memory_order_acq_rel) + 1;
}

void wait_event(const WireTensor& wire, cuda::Stream stream) {
  if (wire.event_owner < 0) return;
  if (wire.event_slot < 0 || wire.event_slot >= kSlots) {
    throw CudaError(fmt::format("a queued cuda tensor names event slot {} of rank {}: corrupt", wire.event_slot,
                                wire.event_owner));
  }
  EventSlot& slot = table_of(wire.event_owner).slots[wire.event_slot];
  if (slot.generation.load(std::memory_order_acquire) != wire.event_generation) {
    // The slot is not this wire's any more (it was freed and recorded again for another wire,
    // whose consumer frees it): leave its state alone.
    throw CudaError(fmt::format("event slot {} of rank {} was recorded again before its consumer waited on it",
                                wire.event_slot, wire.event_owner));
  }
  // From here on every path, throwing or not, frees the slot (unless it is not this wire's).
  bool ours = true;
  try {
    Events& e = events();
    const bool own = wire.event_owner == self().rank;
    if (!own) {
      // Claim the slot so that its producer does not exit (destroying the event) while it is
      // opened and waited on here; a slot the producer already marked done needs no wait.
      std::uint32_t expected = kRecorded;
      if (!slot.state.compare_exchange_strong(expected, kWaiting, std::memory_order_acq_rel)) {
        if (expected == kDone) {
          slot.state.store(kFree, std::memory_order_release);
          return;
        }
        ours = false;
        throw CudaError(fmt::format("event slot {} of rank {} is in state {}, not recorded: a queued cuda "
                                    "tensor was taken twice",
                                    wire.event_slot, wire.event_owner, expected));
      }
    }
    cudaEvent_t event = nullptr;
    {
      std::lock_guard lock(e.mutex);
      if (own) {
        event = e.local[wire.event_slot];
      } else {
        auto key = std::make_pair(wire.event_owner, wire.event_slot);
        auto it = e.opened.find(key);
        if (it == e.opened.end()) {
          if (slot.published.load(std::memory_order_acquire) == 0) {
            throw CudaError(fmt::format("event slot {} of rank {} has no handle", wire.event_slot, wire.event_owner));
          }
          DeviceGuard guard(slot.device);
          cudaEvent_t opened = nullptr;
          check(cudaIpcOpenEventHandle(&opened, slot.handle), "cudaIpcOpenEventHandle");
          it = e.opened.emplace(key, opened).first;
        }
        event = it->second;
      }
    }
    if (event != nullptr) {
      // Captures the event's most recent record now (on the host), so the slot may be recorded
      // again once this call has returned.
      check(cudaStreamWaitEvent(stream, event, 0), "cudaStreamWaitEvent");
    }
  } catch (...) {
    if (ours) slot.state.store(kFree, std::memory_order_release);
    throw;
  }
  slot.state.store(kFree, std::memory_order_release);
}

void release_event(const WireTensor& wire) noexcept {
  if (wire.event_owner < 0 || wire.event_slot < 0 || wire.event_slot >= kSlots) return;
  try {
    table_of(wire.event_owner).slots[wire.event_slot].state.store(kFree, std::memory_order_release);
  } catch (...) {
  }
}

}  // namespace nodal::detail::gpu
