#include <nodal/data/worker_info.hpp>

namespace nodal::data {
namespace {
std::optional<WorkerInfo> g_info;
}  // namespace

std::optional<WorkerInfo> worker_info() noexcept { return g_info; }

void detail::set_worker_info(const WorkerInfo& info) noexcept { g_info = info; }

}  // namespace nodal::data
