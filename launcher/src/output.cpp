#include "output.hpp"

#include <nodal/detail/posix.hpp>

#include <unistd.h>

namespace nodal::launcher {

LineTagger::LineTagger(std::string prefix, int sink_fd, int file_fd, std::size_t keep_last)
    : prefix_(std::move(prefix)), sink_fd_(sink_fd), file_fd_(file_fd), keep_last_(keep_last) {}

LineTagger::~LineTagger() {
  if (file_fd_ >= 0) ::close(file_fd_);
}

void LineTagger::emit(std::string_view line, std::string& batch) {
  batch += prefix_;
  batch += line;
  batch += '\n';
  if (keep_last_ == 0) return;
  last_lines_.emplace_back(line);
  if (last_lines_.size() > keep_last_) last_lines_.pop_front();
}

void LineTagger::feed(std::string_view bytes) {
  if (file_fd_ >= 0) detail::write_all(file_fd_, bytes);
  std::string batch;  // every whole line of this read, written with one call
  while (!bytes.empty()) {
    std::size_t newline = bytes.find('\n');
    if (newline == std::string_view::npos) {
      partial_.append(bytes);
      while (partial_.size() >= kMaxLine) {
        emit(std::string_view(partial_).substr(0, kMaxLine), batch);
        partial_.erase(0, kMaxLine);
      }
      break;
    }
    if (partial_.empty()) {
      emit(bytes.substr(0, newline), batch);
    } else {
      partial_.append(bytes.substr(0, newline));
      emit(partial_, batch);
      partial_.clear();
    }
    bytes.remove_prefix(newline + 1);
  }
  if (!batch.empty()) detail::write_all(sink_fd_, batch);
}

void LineTagger::finish() {
  if (partial_.empty()) return;
  std::string batch;
  emit(partial_, batch);
  partial_.clear();
  detail::write_all(sink_fd_, batch);
}

}  // namespace nodal::launcher
