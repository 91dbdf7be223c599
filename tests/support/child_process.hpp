// Test support: run a command as a child with its stdout and stderr captured, watch its output
// while it runs, signal it, and wait for it with a deadline. Tests run nodalrun through this.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace nodal::testing {

struct ChildResult {
  int exit_code = -1;  ///< the shell's convention: the code, or 128 + signal
  bool timed_out = false;  ///< then `err` ends with what the harness saw (the child's stacks, from gdb)
  std::string out;
  std::string err;
};

class ChildProcess {
 public:
  /// Starts argv[0] (a path) with the current environment plus `extra_env` (NAME=VALUE), which
  /// replaces an inherited variable of the same name.
  explicit ChildProcess(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env = {});
  ~ChildProcess();  ///< kills and reaps the child if still running
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  /// What the child wrote so far.
  const std::string& out() const { return result_.out; }
  /// Reads output until `done(out, err)` holds or the timeout passes; returns whether it held.
  bool wait_for_output(const std::function<bool(const std::string&, const std::string&)>& done,
                       std::chrono::milliseconds timeout);
  void send_signal(int sig);
  /// Waits for the exit (reading all output); on timeout SIGKILLs it and sets timed_out.
  ChildResult wait(std::chrono::milliseconds timeout);

 private:
  bool pump(int timeout_ms);  ///< one poll round; false when both pipes are closed
  std::string timeout_diagnosis();  ///< where the child is at its deadline (its threads' stacks)
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;
  bool reaped_ = false;
  ChildResult result_;
};

/// Runs a command to completion.
ChildResult run(const std::vector<std::string>& argv, std::chrono::milliseconds timeout = std::chrono::seconds(60),
                const std::vector<std::string>& extra_env = {});

/// /proc/PID/NAME as it reads now; empty when the process is gone (never throws for that).
std::string read_proc_file(pid_t pid, const std::string& name);

/// Whether a process with this pid exists; a zombie (dead, not yet reaped) counts only when
/// `count_zombies` is set.
bool process_exists(pid_t pid, bool count_zombies = true);

/// Polls until no pid in `pids` exists (or is more than a zombie, see process_exists); false if
/// some still do after the timeout.
bool wait_until_gone(const std::vector<pid_t>& pids, std::chrono::milliseconds timeout, bool count_zombies = true);

/// Processes (other than this one) whose command line mentions `text`, once none does or after
/// `timeout`: what a job left running (a test puts a unique word in its ranks' arguments).
/// Zombies have no command line and do not count.
std::vector<pid_t> survivors_mentioning(const std::string& text, std::chrono::milliseconds timeout);

/// rank -> pid, as announced by rank_program's "ready <rank> <pid>" lines in tagged output.
std::map<int, pid_t> ready_ranks(const std::string& out);
/// The pids of ready_ranks.
std::vector<pid_t> ready_pids(const std::string& out);

/// Lines of a text, without their '\n'.
std::vector<std::string> lines_of(const std::string& text);
/// How many lines of `text` contain a match of the ECMAScript regex `pattern`.
int count_lines(const std::string& text, const std::string& pattern);

}  // namespace nodal::testing
