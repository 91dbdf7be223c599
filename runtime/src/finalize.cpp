// nodal::finalize() and its hooks (detail/finalize.hpp).
#include <nodal/context.hpp>
#include <nodal/detail/finalize.hpp>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <utility>
#include <vector>

namespace nodal {
namespace detail {
namespace {

struct Hooks {
  std::mutex mutex;
  std::vector<std::function<void()>> pending;  ///< in registration order
  bool done = false;
  int handlers = 0;  ///< atexit handlers registered so far
};

/// Never destroyed: finalize() may run from an atexit handler after static destructors ran.
Hooks& hooks() {
  static auto* h = new Hooks;
  return *h;
}

std::atomic<bool> g_finalized{false};

void run_hook(const std::function<void()>& hook) noexcept {
  try {
    hook();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nodal::finalize: a release failed: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "nodal::finalize: a release failed (unknown exception)\n");
  }
}

}  // namespace

void at_finalize(std::function<void()> hook) {
  Hooks& h = hooks();
  {
    std::lock_guard lock(h.mutex);
    if (!h.done) {
      h.pending.push_back(std::move(hook));
      return;
    }
  }
  run_hook(hook);
}

void finalize_at_exit() {
  Hooks& h = hooks();
  std::lock_guard lock(h.mutex);
  if (h.done) return;
  // One handler per call: each must come after whatever CUDA registered before it. A process
  // opens few GPU backends, so few handlers; the first to run does the work.
  if (h.handlers >= 64) return;
  if (std::atexit([] { finalize(); }) == 0) ++h.handlers;
}

bool finalized() noexcept { return g_finalized.load(std::memory_order_acquire); }

}  // namespace detail

void finalize() {
  detail::Hooks& h = detail::hooks();
  std::vector<std::function<void()>> pending;
  {
    std::lock_guard lock(h.mutex);
    if (h.done) return;
    h.done = true;
    detail::g_finalized.store(true, std::memory_order_release);  // under the lock: no hook misses it
    pending = std::move(h.pending);
  }
  for (auto it = pending.rbegin(); it != pending.rend(); ++it) detail::run_hook(*it);
}

}  // namespace nodal
