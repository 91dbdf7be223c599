// Holding SIGTERM back while this process changes the job's shared structures (the arena's
// allocator and index, a queue's cell), so that terminating a child (Process::terminate,
// Pool::terminate, ProcessContext stopping the rest) never leaves the arena half-changed for
// the processes that go on: a process killed there would hold the allocator's robust mutex
// (unusable for the whole job) or a queue cell (blocking every later put on it).
//
// How: children started by nodal (run_child) install a SIGTERM handler. When no thread of the
// process is inside a TerminationShield section, the handler terminates the process at once, by
// SIGTERM (the exit status reads "killed by SIGTERM", as with the default action); otherwise the
// last thread to leave a section does. In a process without the handler (a rank, a program's
// main process) a section costs one relaxed load and changes nothing. SIGKILL cannot be held
// back: a child killed by it inside a section still breaks what it was changing.
#pragma once

namespace nodal::detail {

/// RAII: a section that SIGTERM does not interrupt (see above). Sections nest and may be open in
/// several threads at once. Entering an outermost section after SIGTERM arrived does not enter:
/// the process ends (at once, or when the other threads' sections end); a nested one is entered,
/// so that the section around it can finish.
class TerminationShield {
 public:
  TerminationShield() noexcept;
  ~TerminationShield();
  TerminationShield(const TerminationShield&) = delete;
  TerminationShield& operator=(const TerminationShield&) = delete;

 private:
  /// Whether the handler is installed in this process (children: from their first instruction of
  /// nodal code on). Where it is not (ranks, a program's main process: the hot paths), a section
  /// is one relaxed load and nothing else.
  bool active_;
};

/// Installs the deferring SIGTERM handler in this process (a child nodal started). Idempotent.
void defer_termination_in_shielded_sections() noexcept;

}  // namespace nodal::detail
