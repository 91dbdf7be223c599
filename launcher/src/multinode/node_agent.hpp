// nodalrun as one node's agent of a job that spans nodes (DESIGN.md "Multi-node"; Open MPI's
// coll/han and UCC's cl/hier for the shape). The agents are the job's MPI processes: they join
// through the engine (internode.hpp) before any rank starts, agree on the global ranks (torchrun's
// rule: node k's ranks follow node k-1's), move the steps of the ranks' collectives between nodes
// (nodal/detail/node_bridge.hpp) and their send/recv with other nodes' ranks (p2p_relay.hpp),
// and carry failures: a rank's failure on one node is announced to every other (named in their
// reports), and a node not heard from for NODAL_NODE_TIMEOUT seconds (default 10; heartbeats
// every quarter of it) fails the job on the others.
//
// All engine calls but abort run on the agent's own thread; nodalrun's event loop learns of a
// remote failure through event_fd().
#pragma once

#include <nodal/arena.hpp>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "multinode/internode.hpp"
#include "multinode/node_launch.hpp"
#include "multinode/p2p_relay.hpp"
#include "options.hpp"
#include "placement.hpp"

namespace nodal::detail {
struct NodeBridge;
struct BridgeStep;
}

namespace nodal::launcher {

struct NodeInfo {
  int local_size = 0;  ///< ranks on the node (its nodalrun's -n)
  int first_rank = 0;  ///< the global rank of its local rank 0
  std::string host;
  /// The machine it runs on: the kernel's boot id, the same for nodes that are containers or
  /// network namespaces of one machine (with host names of their own) and so share its cores.
  std::string machine;
};

/// What ended the job elsewhere, as this node reports it.
struct RemoteFailure {
  int exit_code = 1;
  std::string detail;  ///< "rank 3 on node 1 (host) failed first: exited with code 3"
};

/// nodalrun's exit code when a node is lost (not heard from within NODAL_NODE_TIMEOUT).
inline constexpr int kNodeLostExitCode = 1;

class NodeAgent {
 public:
  /// Joins the other agents and exchanges every node's rank count (options.nprocs), host name,
  /// MASTER_ADDR (options.master_addr or node 0's host; every node must give the same),
  /// MASTER_PORT (free on node 0) and step buffer size (NODAL_NODE_BUFFER_BYTES, the same on all).
  /// Throws UsageError for disagreeing nodes, std::runtime_error when the engine cannot start.
  NodeAgent(const NodeLaunch& launch, const Options& options);
  ~NodeAgent();
  NodeAgent(const NodeAgent&) = delete;
  NodeAgent& operator=(const NodeAgent&) = delete;

  int node_rank() const { return node_rank_; }
  int nnodes() const { return static_cast<int>(nodes_.size()); }
  int world_size() const { return world_size_; }
  int first_rank() const { return nodes_[static_cast<std::size_t>(node_rank_)].first_rank; }
  const std::vector<NodeInfo>& nodes() const { return nodes_; }
  const std::string& master_addr() const { return master_addr_; }
  int master_port() const { return master_port_; }
  /// This node's ranks among those of every node on its machine (NodeInfo::machine).
  HostShare host_share() const;
  /// "node 1 (host)".
  std::string label(int node) const;

  /// Makes the node bridge in `arena` (before the ranks start) and serves it until finish().
  /// Throws ShmError when the arena has no room for its buffers.
  void serve(Arena& arena);
  /// Readable (an eventfd) when remote_failure() has something.
  int event_fd() const { return event_fd_; }
  std::optional<RemoteFailure> remote_failure();
  /// A rank of this node failed: tell the other nodes (`global_rank` -1 when no rank is to blame).
  void announce_failure(int global_rank, int exit_code, const std::string& detail);
  /// The ranks are done: stop reading the arena (returns once the agent no longer touches it).
  void stop_serving();
  /// The job's end on this node with `exit_code`. 0: waits for every node to end (heartbeats go
  /// on meanwhile), leaves the job and returns 0, or a remote failure's code if one came first.
  /// Else: tells the other nodes, then ends the job everywhere through the launcher (MPI_Abort;
  /// if that has not ended this process within 5 s, it exits with `exit_code`): does not return.
  int finish(int exit_code);

 private:
  void main(const NodeLaunch& launch, const Options& options);
  void exchange(const Options& options);
  void serve_steps();
  bool serve_step(std::uint64_t step);
  /// Moves a reduction step in the folded shape (node_bridge.hpp; folded_step.cpp): `buffer` is the
  /// step's, each contributor's part at global rank x step.bytes; `float_mode` the mode to fold in
  /// (BridgeRank::float_mode). False when the job is ending.
  bool fold_step(const detail::BridgeStep& step, std::byte* buffer, std::uint32_t float_mode);
  /// Starts the allgather of every node's block_, its first `length` bytes (a step's description
  /// and a small step's data), into blocks_, node k's at k x block_bytes_ (beyond
  /// direct_max_nodes_ nodes, the MPI library's allgather of whole blocks).
  void allgather_blocks(std::size_t length);
  /// Starts, as the collective in flight, sending `my_bytes` at `mine` to every other node and
  /// receiving theirs(k) = {where, bytes} from each node k (nothing where a size is 0), exactly
  /// those bytes or up to them (`receive`: NODAL_INTERNODE_RECV or _RECV_UP_TO): one round of
  /// direct sends and receives (used up to direct_max_nodes_ nodes).
  void exchange_with_every_node(std::byte* mine, std::size_t my_bytes,
                                const std::function<std::pair<std::byte*, std::size_t>(int)>& theirs,
                                int receive = NODAL_INTERNODE_RECV);
  /// Sends what is queued, receives notices, sends heartbeats, checks the other nodes' silence.
  void poll();
  /// Until the engine's collective completes, polling meanwhile; gives up when another node
  /// failed or (`serving`) the ranks are done.
  void wait_collective(bool serving);
  /// Until `done` (read under mutex_) holds, polling every 20 ms meanwhile.
  void wait_polling(const std::function<bool()>& done);
  void set_remote_failure(RemoteFailure failure);
  /// Moves send/recv across nodes along (p2p_relay.hpp), when serving.
  void progress_p2p();
  /// Whether send/recv across nodes needs the agent to poll rather than sleep.
  bool p2p_busy() const { return relay_ && relay_->busy(); }
  /// Whether a message moved across nodes in the last kP2PHot: the agent then yields between
  /// polls instead of napping, since the next message of a ping-pong follows within microseconds.
  bool p2p_hot() const;
  /// Ends the relay (the arena is about to go): moves the last answers when the ranks are done
  /// (`ranks_done`), then cancels what the engine holds.
  void end_p2p(bool ranks_done);
  bool stopping() const;

  std::unique_ptr<InterNode> engine_;
  std::thread thread_;
  int node_rank_ = 0;
  int world_size_ = 0;
  std::vector<NodeInfo> nodes_;
  std::string master_addr_;
  int master_port_ = 0;
  std::size_t buffer_bytes_ = 0;  ///< each step buffer's size (NODAL_NODE_BUFFER_BYTES), the same on every node
  std::uint64_t fold_min_bytes_ = 0;  ///< NODAL_NODE_FOLD_MIN_BYTES (node_bridge.hpp), the same on every node
  /// Up to this many nodes the agents send to each other directly (kDirectAllgatherNodes in
  /// node_agent.cpp, or NODAL_NODE_DIRECT_MAX_NODES), the same on every node.
  int direct_max_nodes_ = 0;
  int event_fd_ = -1;
  std::chrono::duration<double> node_timeout_{10.0};

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  bool ready_ = false;            ///< the exchange is done (or failed: error_)
  std::exception_ptr error_;
  Arena* arena_ = nullptr;        ///< set by serve()
  bool serving_ = false;          ///< the agent thread may touch the arena
  bool stop_serving_ = false;     ///< stop_serving() was called
  bool finishing_ = false;        ///< finish() was called
  bool finished_ = false;         ///< the thread is done
  int finish_code_ = 0;
  std::deque<std::string> outgoing_;
  std::optional<RemoteFailure> remote_;
  bool remote_taken_ = false;

  // The agent thread's own.
  detail::NodeBridge* bridge_ = nullptr;
  /// A step whose data is at most this many bytes per rank rides with the step descriptions in
  /// one round (see serve_step); the same on every node.
  std::size_t small_step_bytes_ = 0;
  std::size_t block_bytes_ = 0;     ///< room for one node's block in that round
  std::vector<std::byte> block_;    ///< this node's block
  std::vector<std::byte> blocks_;   ///< every node's
  std::vector<nodal_internode_transfer> transfers_;  ///< exchange_with_every_node's in flight
  std::vector<std::chrono::steady_clock::time_point> last_heard_;
  std::chrono::steady_clock::time_point last_beat_{};
  std::unique_ptr<P2PRelay> relay_;  ///< while serving
  std::uint64_t p2p_activity_ = 0;   ///< relay_->activity() when progress_p2p() last looked
  std::chrono::steady_clock::time_point p2p_hot_until_{};
  /// Relay notices that came before this node serves (its ranks start later than another node's).
  std::deque<std::pair<int, std::string>> early_p2p_;
  bool p2p_ended_ = false;  ///< the relay has ended: its notices are dropped
};

}  // namespace nodal::launcher
