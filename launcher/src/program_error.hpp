// A program nodalrun cannot start: exits 127 (not found) or 126 (not executable), like a shell.
#pragma once

#include <nodal/errors.hpp>

namespace nodal::launcher {

class ProgramError : public Error {
 public:
  ProgramError(int exit_code, const std::string& message) : Error(message), exit_code_(exit_code) {}
  int exit_code() const noexcept { return exit_code_; }

 private:
  int exit_code_;
};

}  // namespace nodal::launcher
