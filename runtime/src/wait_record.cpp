#include <nodal/arena.hpp>
#include <nodal/detail/control.hpp>
#include <nodal/detail/exception_report.hpp>
#include <nodal/detail/storage.hpp>
#include <nodal/detail/wait_record.hpp>

#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

namespace nodal::detail {

constinit thread_local BlockingCall* t_blocking_call = nullptr;
std::atomic<std::uint64_t>* g_wait_heartbeat = nullptr;

namespace {

RankWaits* g_row = nullptr;  ///< this process's row, set by bind_wait_record
bool g_unbound = false;      ///< a child of nodal::spawn: never binds

int this_thread_id() noexcept { return static_cast<int>(::syscall(SYS_gettid)); }

std::int64_t realtime_ns() noexcept {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

void copy_text(char* out, std::size_t size, std::string_view text) noexcept {
  std::size_t n = std::min(size - 1, text.size());
  std::memcpy(out, text.data(), n);
  out[n] = '\0';
}

/// Writes the entry as one seqlock update: readers never see half of it.
template <class Write>
void update(WaitEntry& entry, Write&& write) noexcept {
  const std::uint32_t version = entry.version.load(std::memory_order_relaxed);
  entry.version.store(version + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  write();
  entry.version.store(version + 2, std::memory_order_release);
}

/// The call's description: its BlockingCall's, or the waiter's own name when no call is open.
void describe(const BlockingCall* call, DescribeCall fn, const void* context, std::string_view fallback,
              WaitEntry& entry) noexcept {
  std::string what;
  std::string waiting_for;
  try {
    if (call) {
      fn(context, what, waiting_for);
    } else {
      what = std::string(fallback);
    }
  } catch (...) {
    what = std::string(fallback);  // a description must never break the wait it describes
  }
  copy_text(entry.what, sizeof entry.what, what);
  copy_text(entry.waiting_for, sizeof entry.waiting_for, waiting_for);
}

void answer_stack_request(WaitEntry& entry) noexcept {
  const std::uint32_t request = job_arena().control().stack_request.load(std::memory_order_acquire);
  if (request == entry.stack_answered.load(std::memory_order_relaxed)) return;
  const ControlEndpoint endpoint = control_endpoint();
  if (endpoint.fd >= 0) {
    try {
      std::string text = fmt::format("thread {} in {}\n{}", entry.tid.load(std::memory_order_relaxed), entry.what,
                                     current_stack_trace(/*skip=*/2));
      if (text.size() > kMaxControlText) text.resize(kMaxControlText);
      send_control(endpoint.fd, {ControlKind::wait_stack, endpoint.rank, static_cast<int>(::getpid()), text});
    } catch (...) {
      // No memory for the text: the table still shows the wait.
    }
  }
  entry.stack_answered.store(request, std::memory_order_release);
}

}  // namespace

ObjectName::ObjectName(std::string_view name) noexcept { copy_text(text, sizeof text, name); }

void bind_wait_record(int rank) noexcept {
  if (g_unbound) return;
  int ranks = 0;
  RankWaits* table = job_arena_exists() ? wait_table(job_arena(), &ranks) : nullptr;
  if (!table || rank < 0 || rank >= ranks) return;
  g_row = &table[rank];
  g_wait_heartbeat = &g_row->calls;
}

void unbind_wait_record() noexcept {
  g_unbound = true;
  g_row = nullptr;
  g_wait_heartbeat = nullptr;
}

WaitEntry* begin_waiting(std::string_view what) noexcept {
  if (!g_row) return nullptr;
  BlockingCall* call = t_blocking_call;
  WaitEntry* entry = call ? call->entry_ : nullptr;
  if (!entry) {
    const int tid = this_thread_id();
    for (WaitEntry& candidate : g_row->entries) {
      std::int32_t none = 0;
      if (candidate.tid.compare_exchange_strong(none, tid, std::memory_order_acq_rel)) {
        entry = &candidate;
        break;
      }
    }
    if (!entry) return nullptr;
    if (call) call->entry_ = entry;
    // A new holder answers only the requests made from now on.
    entry->stack_answered.store(job_arena().control().stack_request.load(std::memory_order_relaxed),
                                std::memory_order_relaxed);
    update(*entry, [&] { entry->since_ns = realtime_ns(); });
  }
  update(*entry, [&] {
    entry->state.store(WaitEntry::waiting, std::memory_order_relaxed);
    describe(call, call ? call->describe_ : nullptr, call ? call->context_ : nullptr, what, *entry);
  });
  return entry;
}

void refresh_waiting(WaitEntry* entry, std::string_view what) noexcept {
  BlockingCall* call = t_blocking_call;
  if (call && call->entry_ != entry) call = nullptr;  // an inner wait of its own
  update(*entry, [&] { describe(call, call ? call->describe_ : nullptr, call ? call->context_ : nullptr, what, *entry); });
  answer_stack_request(*entry);
}

void end_waiting(WaitEntry* entry) noexcept {
  BlockingCall* call = t_blocking_call;
  if (call && call->entry_ == entry) {
    update(*entry, [&] {
      entry->state.store(WaitEntry::in_call, std::memory_order_relaxed);
      entry->waiting_for[0] = '\0';
    });
    return;
  }
  update(*entry, [&] { entry->state.store(WaitEntry::free, std::memory_order_relaxed); });
  entry->tid.store(0, std::memory_order_release);
}

void BlockingCall::release() noexcept {
  WaitEntry* entry = entry_;
  entry_ = nullptr;
  update(*entry, [&] { entry->state.store(WaitEntry::free, std::memory_order_relaxed); });
  entry->tid.store(0, std::memory_order_release);
}

}  // namespace nodal::detail
