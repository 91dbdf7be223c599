// What the collectives' rank programs share: a check that fails loudly (a "FAIL rank R: ..." line
// and exit 1, which the tests look for), a count of checks made, and main()'s mode dispatch.
#pragma once

#include <nodal/communicator.hpp>
#include <nodal/nodal.hpp>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <map>
#include <string>

namespace nodal::testing {

inline int g_rank = 0;
inline long g_checks = 0;

[[noreturn]] inline void fail(const std::string& what) {
  std::printf("FAIL rank %d: %s\n", g_rank, what.c_str());
  std::fflush(stdout);
  std::_Exit(1);
}

inline void expect(bool ok, const std::string& what) {
  if (!ok) fail(what);
  ++g_checks;
}

using Mode = std::function<int(nodal::Communicator&)>;

/// main() of a rank program: joins the job, runs the mode argv[1] names on the world communicator
/// (an escaping exception is a FAIL line), 64 for an unknown mode. Output is line-buffered.
inline int run_mode(int argc, char** argv, const char* program, const std::map<std::string, Mode>& modes) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  nodal::Context ctx = nodal::init();
  g_rank = ctx.rank();
  nodal::Communicator comm = ctx.world();
  const std::string mode = argc > 1 ? argv[1] : "";
  const auto it = modes.find(mode);
  if (it == modes.end()) {
    std::fprintf(stderr, "%s: unknown mode '%s'\n", program, mode.c_str());
    return 64;
  }
  try {
    return it->second(comm);
  } catch (const std::exception& e) {
    fail(std::string("exception: ") + e.what());
  }
}

}  // namespace nodal::testing
