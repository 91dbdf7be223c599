// Where the built binaries the tests run are (set by tests/CMakeLists.txt).
#pragma once

#include <string>
#include <vector>

namespace nodal::testing {

inline const std::string kNodalrun = NODAL_TEST_NODALRUN;
inline const std::string kRankProgram = NODAL_TEST_RANK_PROGRAM;
inline const std::string kShmProgram = NODAL_TEST_SHM_PROGRAM;
inline const std::string kCollProgram = NODAL_TEST_COLL_PROGRAM;

/// {nodalrun, args...}
inline std::vector<std::string> nodalrun_command(std::vector<std::string> args) {
  args.insert(args.begin(), kNodalrun);
  return args;
}

}  // namespace nodal::testing
