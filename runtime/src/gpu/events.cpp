// Stream order between a producer and its consumers (gpu.hpp "Queue hand-off"): each rank has a
// pool of interprocess events (cudaEventDisableTiming | cudaEventInterprocess). put() records
// one on the producer's stream; get() makes the consumer's stream wait for it. Opening an event
// handle costs ~240 us (DESIGN.md "GPU facts"), so events are reused: each slot's handle is
// published in the arena once and opened once per consumer process, and a slot is recorded again
// only after the consumer has queued its wait (the slot's state goes back to free then).
#include "common.hpp"
#include "driver.hpp"

#include <nodal/arena.hpp>
#include <nodal/errors.hpp>
#include <nodal/detail/storage.hpp>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace nodal::detail::gpu {
namespace {

constexpr int kSlots = 64;

enum SlotState : std::uint32_t {
  kFree = 0,      ///< the owner may record it
  kRecorded = 1,  ///< recorded for a wire; a consumer will wait on it
  kDone = 2,      ///< recorded, and the owner has seen it complete (it is exiting): no wait needed
};

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
/// process that no longer exists. Registered after the CUDA runtime started, so it runs before
/// the runtime's own teardown.
void finish_events_at_exit() {
  Events& e = events();
  std::lock_guard lock(e.mutex);
  if (e.own == nullptr) return;
  for (int s = 0; s < kSlots; ++s) {
    EventSlot& slot = e.own->slots[s];
    if (e.local[s] == nullptr || slot.state.load(std::memory_order_acquire) != kRecorded) continue;
    if (cudaEventSynchronize(e.local[s]) == cudaSuccess) {
      std::uint32_t expected = kRecorded;
      slot.state.compare_exchange_strong(expected, kDone, std::memory_order_acq_rel);
    }
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
    throw CudaError(fmt::format("event slot {} of rank {} was recorded again before its consumer waited on it",
                                wire.event_slot, wire.event_owner));
  }
  Events& e = events();
  cudaEvent_t event = nullptr;
  {
    std::lock_guard lock(e.mutex);
    if (wire.event_owner == self().rank) {
      event = e.local[wire.event_slot];
    } else if (slot.state.load(std::memory_order_acquire) == kDone) {
      event = nullptr;  // the producer saw it complete (and may be gone)
    } else {
      auto key = std::make_pair(wire.event_owner, wire.event_slot);
      auto it = e.opened.find(key);
      if (it == e.opened.end()) {
        if (slot.published.load(std::memory_order_acquire) == 0) {
          throw CudaError(fmt::format("event slot {} of rank {} has no handle", wire.event_slot, wire.event_owner));
        }
        DeviceGuard guard(slot.device);
        cudaEvent_t opened = nullptr;
        cudaError_t result = cudaIpcOpenEventHandle(&opened, slot.handle);
        if (result != cudaSuccess && slot.state.load(std::memory_order_acquire) == kDone) {
          (void)cudaGetLastError();  // the producer finished it and exited meanwhile
        } else {
          check(result, "cudaIpcOpenEventHandle");
          it = e.opened.emplace(key, opened).first;
          event = opened;
        }
      } else {
        event = it->second;
      }
    }
  }
  if (event != nullptr) {
    // Captures the event's most recent record now (on the host), so the slot may be recorded
    // again once this call has returned.
    cudaError_t result = cudaStreamWaitEvent(stream, event, 0);
    if (result != cudaSuccess) {
      slot.state.store(kFree, std::memory_order_release);
      check(result, "cudaStreamWaitEvent");
    }
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
