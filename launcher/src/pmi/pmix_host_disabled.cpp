// PmixHost in a build without libpmix (pkg-config pmix not found): nodalrun serves PMI-1 only.
#include "pmix_host.hpp"

#include <stdexcept>

namespace nodal::launcher {

bool pmix_built() noexcept { return false; }

struct PmixHost::State {};

PmixHost::PmixHost(const std::string&, int, const std::string&) {
  throw std::runtime_error("this nodalrun was built without libpmix (Debian: libpmix-dev), so it cannot serve PMIx");
}
PmixHost::~PmixHost() = default;
std::vector<std::string> PmixHost::client_environment(int) { return {}; }
int PmixHost::event_fd() const { return -1; }
std::vector<PmixEvent> PmixHost::take_events() { return {}; }

}  // namespace nodal::launcher
