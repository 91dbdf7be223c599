// Rank output: whole lines, each prefixed with the rank, so ranks never mix within a line.
#pragma once

#include <cstddef>
#include <deque>
#include <string>
#include <string_view>

namespace nodal::launcher {

/// Splits one rank's stream into lines and writes each line, prefixed, to a sink fd.
/// nodalrun is single-threaded and writes only whole lines, so the terminal or pipe it writes to
/// sees every line of every rank intact. Optionally copies the raw bytes to a file (--output-dir)
/// and keeps the last lines (for the failure report).
class LineTagger {
 public:
  /// A line longer than this is cut into pieces of this size, each tagged.
  static constexpr std::size_t kMaxLine = 64 * 1024;

  /// Writes lines to sink_fd (not owned); copies raw bytes to file_fd when >= 0 (owned: closed
  /// with the tagger).
  LineTagger(std::string prefix, int sink_fd, int file_fd, std::size_t keep_last);
  ~LineTagger();
  LineTagger(const LineTagger&) = delete;
  LineTagger& operator=(const LineTagger&) = delete;

  /// Takes the next bytes read from the rank's pipe.
  void feed(std::string_view bytes);
  /// End of stream: a last line without '\n' is written with one.
  void finish();

  const std::deque<std::string>& last_lines() const noexcept { return last_lines_; }

 private:
  void emit(std::string_view line, std::string& batch);

  std::string prefix_;
  int sink_fd_;
  int file_fd_;
  std::size_t keep_last_;
  std::string partial_;
  std::deque<std::string> last_lines_;
};

}  // namespace nodal::launcher
