#include "child_process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <system_error>
#include <thread>

#include <fmt/format.h>

extern char** environ;

namespace nodal::testing {

ChildProcess::ChildProcess(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env) {
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) < 0 || ::pipe2(err, O_CLOEXEC) < 0) throw std::system_error(errno, std::generic_category(), "pipe2");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err[1], STDERR_FILENO);
  // extra_env replaces an inherited variable of the same name (getenv reads the first one).
  auto name_of = [](const std::string& entry) { return entry.substr(0, entry.find('=')); };
  std::set<std::string> replaced;
  for (const auto& e : extra_env) replaced.insert(name_of(e));
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) {
    if (!replaced.count(name_of(*e))) env_strings.emplace_back(*e);
  }
  env_strings.insert(env_strings.end(), extra_env.begin(), extra_env.end());
  std::vector<char*> c_argv, c_env;
  for (const auto& a : argv) c_argv.push_back(const_cast<char*>(a.c_str()));
  c_argv.push_back(nullptr);
  for (const auto& e : env_strings) c_env.push_back(const_cast<char*>(e.c_str()));
  c_env.push_back(nullptr);
  int rc = ::posix_spawn(&pid_, c_argv[0], &actions, nullptr, c_argv.data(), c_env.data());
  posix_spawn_file_actions_destroy(&actions);
  ::close(out[1]);
  ::close(err[1]);
  out_fd_ = out[0];
  err_fd_ = err[0];
  if (rc != 0) throw std::system_error(rc, std::generic_category(), "posix_spawn " + argv[0]);
}

ChildProcess::~ChildProcess() {
  if (!reaped_ && pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  if (out_fd_ >= 0) ::close(out_fd_);
  if (err_fd_ >= 0) ::close(err_fd_);
}

bool ChildProcess::pump(int timeout_ms) {
  pollfd fds[2] = {{out_fd_, POLLIN, 0}, {err_fd_, POLLIN, 0}};
  if (out_fd_ < 0 && err_fd_ < 0) return false;
  int n = ::poll(fds, 2, timeout_ms);
  if (n <= 0) return true;
  int* fd_ptrs[2] = {&out_fd_, &err_fd_};
  std::string* sinks[2] = {&result_.out, &result_.err};
  for (int i = 0; i < 2; ++i) {
    if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    char buf[65536];
    ssize_t got = ::read(fds[i].fd, buf, sizeof buf);
    if (got > 0) {
      sinks[i]->append(buf, static_cast<std::size_t>(got));
    } else if (got == 0 || errno != EINTR) {
      ::close(*fd_ptrs[i]);
      *fd_ptrs[i] = -1;
    }
  }
  return out_fd_ >= 0 || err_fd_ >= 0;
}

bool ChildProcess::wait_for_output(const std::function<bool(const std::string&, const std::string&)>& done,
                                   std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done(result_.out, result_.err)) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    if (!pump(10)) return done(result_.out, result_.err);
  }
  return true;
}

void ChildProcess::send_signal(int sig) { ::kill(pid_, sig); }

ChildResult ChildProcess::wait(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  for (;;) {
    bool open = pump(10);
    if (!reaped_) {
      pid_t got = ::waitpid(pid_, &status, WNOHANG);
      if (got == pid_) {
        reaped_ = true;
        result_.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
    }
    if (reaped_ && !open) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      result_.timed_out = true;
      result_.err += timeout_diagnosis();
      if (!reaped_) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        reaped_ = true;
        result_.exit_code = 128 + SIGKILL;
      }
      break;
    }
    if (reaped_) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return result_;
}

std::string ChildProcess::timeout_diagnosis() {
  if (reaped_) {
    return fmt::format("\n[test harness] timed out: pid {} had exited with {}, but its stdout or stderr stayed open "
                       "(a descendant still holds them)\n", pid_, result_.exit_code);
  }
  std::string text = fmt::format("\n[test harness] timed out: pid {} was still running", pid_);
  const char* gdb = "/usr/bin/gdb";
  if (::access(gdb, X_OK) != 0) return text + " (no gdb for its stacks)\n";
  // A stuck program's threads say where it is stuck: the one clue a timeout on CI leaves.
  ChildResult stacks = run({gdb, "-p", std::to_string(pid_), "-batch", "-nx", "-ex", "thread apply all bt"},
                           std::chrono::seconds(30));
  return text + "; its threads:\n" + stacks.out + stacks.err + "\n";
}

ChildResult run(const std::vector<std::string>& argv, std::chrono::milliseconds timeout,
                const std::vector<std::string>& extra_env) {
  ChildProcess child(argv, extra_env);
  return child.wait(timeout);
}

std::string read_proc_file(pid_t pid, const std::string& name) {
  // With read(2), not an ifstream: a process that exits between open and read makes the read
  // fail with ESRCH, which libstdc++'s filebuf turns into an exception under istreambuf_iterator
  // (seen once in CI, under ASan).
  std::string text;
  const std::string path = "/proc/" + std::to_string(pid) + "/" + name;
  if (const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC); fd >= 0) {
    char buffer[4096];
    for (ssize_t got; (got = ::read(fd, buffer, sizeof buffer)) > 0;) text.append(buffer, static_cast<std::size_t>(got));
    ::close(fd);
  }
  return text;
}

bool process_exists(pid_t pid, bool count_zombies) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(stat, text)) return false;
  // "pid (comm) S ...": the state follows the last ')' (comm may hold spaces and parentheses).
  auto close = text.rfind(')');
  char state = close != std::string::npos && close + 2 < text.size() ? text[close + 2] : '?';
  return count_zombies || state != 'Z';
}

bool wait_until_gone(const std::vector<pid_t>& pids, std::chrono::milliseconds timeout, bool count_zombies) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    bool any = false;
    for (pid_t pid : pids) any |= process_exists(pid, count_zombies);
    if (!any) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
}

int count_lines(const std::string& text, const std::string& pattern) {
  const std::regex re(pattern);
  int n = 0;
  for (const std::string& line : lines_of(text))
    if (std::regex_search(line, re)) ++n;
  return n;
}

std::map<int, pid_t> ready_ranks(const std::string& out) {
  std::map<int, pid_t> ranks;
  for (const std::string& line : lines_of(out)) {
    auto pos = line.find("] ready ");
    if (pos == std::string::npos) continue;
    int rank = 0, pid = 0;
    if (std::sscanf(line.c_str() + pos + 8, "%d %d", &rank, &pid) == 2) ranks[rank] = pid;
  }
  return ranks;
}

std::vector<pid_t> ready_pids(const std::string& out) {
  std::vector<pid_t> pids;
  for (auto [rank, pid] : ready_ranks(out)) pids.push_back(pid);
  return pids;
}

std::vector<pid_t> survivors_mentioning(const std::string& text, std::chrono::milliseconds timeout) {
  auto mentioning = [&text] {
    std::vector<pid_t> found;
    std::error_code error;  // processes come and go while /proc is read
    for (std::filesystem::directory_iterator it("/proc", error), end; !error && it != end; it.increment(error)) {
      const std::filesystem::directory_entry& entry = *it;
      const std::string name = entry.path().filename().string();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      const std::string cmdline = read_proc_file(std::stoi(name), "cmdline");
      if (cmdline.find(text) != std::string::npos && std::stoi(name) != ::getpid()) found.push_back(std::stoi(name));
    }
    return found;
  };
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<pid_t> left = mentioning();
  while (!left.empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    left = mentioning();
  }
  return left;
}

}  // namespace nodal::testing
