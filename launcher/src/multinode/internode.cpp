#include "multinode/internode.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

namespace nodal::launcher {
namespace {

constexpr const char* kPluginFile = "libnodal_internode_mpi.so";

std::vector<std::string> plugin_candidates() {
  if (const char* path = std::getenv("NODAL_INTERNODE_PLUGIN")) return {path};
  char self[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return {kPluginFile};
  const std::filesystem::path dir = std::filesystem::path(std::string(self, static_cast<std::size_t>(n))).parent_path();
  // Installed: bin/nodalrun and lib/ (or lib64/); in the build tree: next to nodalrun.
  return {(dir / ".." / "lib" / kPluginFile).string(), (dir / ".." / "lib64" / kPluginFile).string(),
          (dir / kPluginFile).string()};
}

}  // namespace

std::unique_ptr<InterNode> InterNode::load() {
  std::unique_ptr<InterNode> self(new InterNode);
  std::string tried;
  for (const std::string& path : plugin_candidates()) {
    self->library_ = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (self->library_) break;
    tried += fmt::format("\n  {}: {}", path, ::dlerror());
  }
  if (!self->library_) {
    throw std::runtime_error(fmt::format("multi-node mode needs nodal's MPI engine ({}; built where MPI is installed: "
                                         "Debian libopenmpi-dev), and none could be loaded:{}",
                                         kPluginFile, tried));
  }
  using Entry = const nodal_internode_ops* (*)();
  auto entry = reinterpret_cast<Entry>(::dlsym(self->library_, "nodal_internode_plugin"));
  if (!entry) throw std::runtime_error(fmt::format("{} has no nodal_internode_plugin()", kPluginFile));
  self->ops_ = entry();
  if (!self->ops_ || self->ops_->abi != NODAL_INTERNODE_ABI) {
    throw std::runtime_error(fmt::format("{} speaks another interface version than this nodalrun", kPluginFile));
  }
  self->handle_ = self->ops_->init(self->error_, sizeof self->error_);
  if (!self->handle_) throw std::runtime_error(fmt::format("joining the other nodes failed: {}", self->error_));
  self->rank_ = self->ops_->rank(self->handle_);
  self->size_ = self->ops_->size(self->handle_);
  return self;
}

InterNode::~InterNode() = default;  // the library stays loaded: MPI keeps threads of its own

void InterNode::fail(const char* what) const {
  throw std::runtime_error(fmt::format("{} between nodes ({}): {}", what, ops_->name, error_));
}

void InterNode::allgather_start(const void* send, void* recv, std::uint64_t bytes) {
  if (ops_->allgather_start(handle_, send, recv, bytes, error_, sizeof error_)) fail("allgather");
}
void InterNode::allgatherv_start(void* buffer, const std::uint64_t* counts, const std::uint64_t* displs) {
  if (ops_->allgatherv_start(handle_, buffer, counts, displs, error_, sizeof error_)) fail("allgatherv");
}
void InterNode::broadcast_start(void* buffer, std::uint64_t bytes, int root) {
  if (ops_->broadcast_start(handle_, buffer, bytes, root, error_, sizeof error_)) fail("broadcast");
}
void InterNode::exchange_start(std::vector<nodal_internode_transfer>& transfers) {
  if (ops_->exchange_start(handle_, transfers.data(), static_cast<std::uint32_t>(transfers.size()), error_,
                           sizeof error_)) {
    fail("exchange");
  }
}
void InterNode::barrier_start() {
  if (ops_->barrier_start(handle_, error_, sizeof error_)) fail("barrier");
}
bool InterNode::test() {
  int done = 0;
  if (ops_->test(handle_, &done, error_, sizeof error_)) fail("a collective");
  return done != 0;
}
void InterNode::send_notice(int dest, std::string_view data) {
  if (ops_->send_notice(handle_, dest, data.data(), static_cast<std::uint32_t>(data.size()), error_, sizeof error_)) {
    fail("a notice");
  }
}
std::optional<std::pair<int, std::string>> InterNode::poll_notice() {
  thread_local std::vector<char> buffer(kNoticeBytes);
  char* data = buffer.data();
  int source = -1;
  std::uint32_t bytes = 0;
  if (ops_->poll_notice(handle_, &source, data, static_cast<std::uint32_t>(buffer.size()), &bytes, error_, sizeof error_)) {
    fail("receiving a notice");
  }
  if (source < 0) return std::nullopt;
  return std::make_pair(source, std::string(data, bytes));
}
int InterNode::p2p_tag_limit() { return ops_->p2p_tag_limit(handle_); }
void InterNode::p2p_isend(int dest, int tag, const void* data, std::uint64_t bytes, std::uint64_t cookie) {
  if (ops_->p2p_isend(handle_, dest, tag, data, bytes, cookie, error_, sizeof error_)) fail("a send");
}
void InterNode::p2p_irecv(int source, int tag, void* data, std::uint64_t bytes, std::uint64_t cookie) {
  if (ops_->p2p_irecv(handle_, source, tag, data, bytes, cookie, error_, sizeof error_)) fail("a receive");
}
void InterNode::p2p_completed(std::vector<std::uint64_t>& cookies) {
  std::uint64_t done[64];
  for (;;) {
    std::uint32_t count = 0;
    if (ops_->p2p_completed(handle_, done, 64, &count, error_, sizeof error_)) fail("a send or receive");
    cookies.insert(cookies.end(), done, done + count);
    if (count < 64) return;
  }
}
bool InterNode::p2p_cancel_all() { return ops_->p2p_cancel_all(handle_, error_, sizeof error_) == 0; }
void InterNode::abort(int code) { ops_->abort(handle_, code); }
void InterNode::finalize() {
  if (ops_->finalize(handle_, error_, sizeof error_)) fail("leaving the job");
  handle_ = nullptr;
}

}  // namespace nodal::launcher
