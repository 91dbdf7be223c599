// The agents' channel between nodes: an engine (internode_plugin.h) loaded at run time, wrapped
// for nodalrun. One object per nodalrun; every call but abort() from one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "multinode/internode_plugin.h"

namespace nodal::launcher {

class InterNode {
 public:
  /// Loads the engine: NODAL_INTERNODE_PLUGIN (a path) or libnodal_internode_mpi.so next to
  /// nodalrun (its bin/../lib, or its own directory in the build tree), and joins the agents.
  /// Throws std::runtime_error naming the library and why (not found, MPI_Init failed).
  static std::unique_ptr<InterNode> load();
  ~InterNode();
  InterNode(const InterNode&) = delete;
  InterNode& operator=(const InterNode&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const char* engine() const { return ops_->name; }

  // The collectives start and then complete through test(); each throws std::runtime_error on an
  // engine error.
  void allgather_start(const void* send, void* recv, std::uint64_t bytes);
  void allgatherv_start(void* buffer, const std::uint64_t* counts, const std::uint64_t* displs);
  void broadcast_start(void* buffer, std::uint64_t bytes, int root);
  void barrier_start();
  /// Starts the transfers (internode_plugin.h) as the collective in flight. `transfers` must
  /// stay as it is until test() returns true, which sets each one's `received` (or until the job
  /// ends: an agent that stops waiting calls test() no more).
  void exchange_start(std::vector<nodal_internode_transfer>& transfers);
  bool test();
  void send_notice(int dest, std::string_view data);
  /// A pending notice and its sender, if any.
  std::optional<std::pair<int, std::string>> poll_notice();
  /// The largest notice poll_notice() returns whole (a longer one is cut).
  static constexpr std::size_t kNoticeBytes = 64 * 1024;
  // Point-to-point between agents (internode_plugin.h); each throws std::runtime_error on an
  // engine error.
  int p2p_tag_limit();
  void p2p_isend(int dest, int tag, const void* data, std::uint64_t bytes, std::uint64_t cookie);
  void p2p_irecv(int source, int tag, void* data, std::uint64_t bytes, std::uint64_t cookie);
  /// Appends the cookies of the operations that completed since the last call to `cookies`.
  void p2p_completed(std::vector<std::uint64_t>& cookies);
  /// Cancels what is in flight; returns false when the engine still held some after a second.
  bool p2p_cancel_all();
  /// Ends the job on every node (MPI_Abort). Any thread.
  void abort(int code);
  /// Leaves the job; the object is unusable afterwards.
  void finalize();

 private:
  InterNode() = default;
  [[noreturn]] void fail(const char* what) const;
  void* library_ = nullptr;
  const nodal_internode_ops* ops_ = nullptr;
  nodal_internode* handle_ = nullptr;
  int rank_ = 0;
  int size_ = 1;
  mutable char error_[512] = {};
};

}  // namespace nodal::launcher
