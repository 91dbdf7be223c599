// nodal::spawn: check the arguments, start the children (child_group.hpp), and join them through
// their ProcessContext unless the caller asked for the context itself.
#include <nodal/spawn.hpp>
#include <nodal/errors.hpp>

#include "child_group.hpp"

#include <algorithm>
#include <memory>
#include <utility>

#include <fmt/format.h>

namespace nodal {
namespace {

/// ForkServerEntry: what a child of the fork server runs.
[[noreturn]] void run_forkserver_rank(void (*fn)(int), int rank, int control_fd) {
  detail::run_child(fn, rank, control_fd);
}

}  // namespace

ProcessContext spawn(const std::function<void(int rank)>& fn, int nprocs, const SpawnOptions& options) {
  // Argument checks come before the call is counted: a re-executed child replaying the program
  // then throws the same UsageError at the same place.
  if (nprocs < 1) throw UsageError(fmt::format("nodal::spawn: nprocs is {}; it must be at least 1", nprocs));
  if (!fn) throw UsageError("nodal::spawn: fn is empty");
  void (*const* function)(int) = fn.target<void (*)(int)>();
  if (options.start_method == StartMethod::forkserver && function == nullptr) {
    throw UsageError(
        "nodal::spawn(StartMethod::forkserver): fn must hold a plain function pointer (a function, or a "
        "captureless lambda converted with unary +). The fork server is a copy of the program made before this "
        "closure existed, so it cannot run it (Python's forkserver needs a picklable function for the same "
        "reason); use StartMethod::spawn or StartMethod::fork for closures");
  }
  if (options.start_method == StartMethod::spawn && detail::in_child()) {
    throw UsageError(
        "nodal::spawn(StartMethod::spawn) inside a child's fn: a re-executed child replays main(), which never "
        "reaches a call made inside another call's fn. Use StartMethod::fork or StartMethod::forkserver there");
  }

  const int call = detail::count_start(fn, nprocs);
  if (call == 0) return ProcessContext();  // a re-executed child replaying a call its parent made

  const detail::ChildTarget target{fn, function != nullptr ? *function : nullptr, &run_forkserver_rank};
  ProcessContext context = detail::make_process_context(
      std::make_unique<detail::ChildGroup>(options.start_method, target, nprocs, call, "nodal::spawn"), options.grace);
  if (options.join) {
    while (!context.join()) {
    }
  }
  return context;
}

}  // namespace nodal
