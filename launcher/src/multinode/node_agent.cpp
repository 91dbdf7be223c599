#include "multinode/node_agent.hpp"

#include <nodal/errors.hpp>
#include <nodal/detail/node_bridge.hpp>
#include <nodal/detail/posix.hpp>
#include <nodal/detail/units.hpp>
#include <nodal/detail/wait.hpp>

#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include <fmt/format.h>

#include "free_port.hpp"

namespace nodal::launcher {
namespace {

using SteadyClock = std::chrono::steady_clock;

/// What each agent tells the others at the start.
struct NodeRecord {
  std::int32_t local_size;
  std::int32_t master_port;  ///< node 0's is everyone's
  std::uint64_t buffer_bytes;  ///< NODAL_NODE_BUFFER_BYTES: steps are cut to it, so all nodes must agree
  std::uint64_t fold_min_bytes;  ///< NODAL_NODE_FOLD_MIN_BYTES: the ranks shape steps by it, so likewise
  std::int32_t direct_max_nodes;  ///< NODAL_NODE_DIRECT_MAX_NODES: how the agents exchange, so likewise
  std::int32_t reserved;          ///< 0: no uninitialised padding goes between the nodes
  char host[64];
  char machine[40];  ///< /proc/sys/kernel/random/boot_id (NodeInfo::machine)
  char master_addr[128];
};

// Notices between agents: one letter, then words (text, so that a report can quote them).
constexpr char kHeartbeat = 'H';
constexpr char kFailure = 'F';  // "F<code> <text>"
/// Up to this many nodes, a step's allgathers (its descriptions, then a gathered step's data) and a
/// rooted step's broadcast are every pair's sends and receives at once (exchange_start): one
/// round, without the MPI library's non-blocking collectives' schedules (libnbc), which cost
/// 2 namespace nodes here 30-50 us per small step against 30-35 us. Beyond, the library's own
/// (its rounds grow as log(nodes), and it does not send one node's data to every other itself).
/// NODAL_NODE_DIRECT_MAX_NODES overrides it (the tests run the library's path on 3 nodes so).
constexpr int kDirectAllgatherNodes = 8;
/// Room for a node's data in a step's first round, with the descriptions: a step whose data fits
/// (a small step) takes that one round between the agents; a larger one takes a second, for the
/// data. Up to direct_max_nodes_ nodes, each node sends its description and its data as one
/// message of the length they need, and receives up to this much from each (RECV_UP_TO). Against
/// 1 KiB of room, on 2 namespace nodes (bench/results/2026-11-28-multinode-one-round.md): a
/// 2 x 1 allreduce of 2-64 KiB per rank 1.2-1.7x faster, 2 x 2 at 1-16 KiB 1.1-1.5x; 2 x 2 at
/// 32 KiB (a full block, above Open MPI's TCP eager limit) 0.87x in that run, inside its noise.
constexpr std::size_t kOneRoundNodeBytes = 64 << 10;
/// Beyond, the round is the MPI library's allgather of fixed blocks, which every step, however
/// small, sends whole: 56 + this many bytes from each node.
constexpr std::size_t kLibraryRoundNodeBytes = 1 << 10;
/// How long a failing agent waits between its report and ending the job through the launcher.
constexpr auto kOutputGrace = std::chrono::milliseconds(250);
/// How long the agent looks for the ranks' next call, yielding, before it sleeps on the bridge.
constexpr auto kHotWait = std::chrono::microseconds(500);
// How long the agent yields rather than naps after a message moved across nodes. A nap of 50 us
// costs a ping-pong every time it falls between two messages. With yields only, the round trip of a
// small message across 2 namespace nodes went from 104-213 us to 63-92 us (2026-11-27). Past this
// long without a message, the agent naps again, leaving the cores to the ranks.
constexpr auto kP2PHot = std::chrono::milliseconds(2);
/// How long the agent, once its ranks are done, goes on moving a refused one-chunk message
/// (p2p_relay.hpp) into the other node's ring, so that nothing is in flight when the job ends.
constexpr auto kP2PDrain = std::chrono::seconds(5);

std::string host_name() {
  char name[64] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}

/// The kernel's boot id (a UUID drawn at boot): one per machine, whatever its containers' host
/// names; the host name where it cannot be read.
std::string machine_id() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (in >> id && !id.empty()) return id;
  return host_name();
}

/// A whole number from 1 to 2^20 from the environment, or `fallback`.
int env_count(const char* name, int fallback) {
  const char* text = std::getenv(name);
  if (!text) return fallback;
  const int value = detail::parse_int(text);  // -1 unless a whole number >= 0
  if (value < 1 || value > 1 << 20) {
    throw UsageError(fmt::format("{}={}: expected a whole number from 1 to {}", name, text, 1 << 20));
  }
  return value;
}

double env_seconds(const char* name, double fallback) {
  const char* text = std::getenv(name);
  if (!text) return fallback;
  double value = 0;
  auto [end, error] = std::from_chars(text, text + std::strlen(text), value);
  if (error != std::errc() || *end != '\0' || !(value > 0)) {
    throw UsageError(fmt::format("{}={}: expected a number of seconds > 0", name, text));
  }
  return value;
}

std::string describe_step(const detail::BridgeStep& s) {
  if (s.kind == 0xff) return "a call that differs between this node's ranks";
  return detail::describe_bridge_step(s);
}

}  // namespace

NodeAgent::NodeAgent(const NodeLaunch& launch, const Options& options) {
  node_timeout_ = std::chrono::duration<double>(env_seconds("NODAL_NODE_TIMEOUT", 10.0));
  event_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (event_fd_ < 0) detail::throw_errno("eventfd");
  // The agent thread, and the threads MPI starts from it, take no signals: nodalrun's event loop
  // reads SIGCHLD and the forwarded signals from a signalfd, which sees only blocked signals.
  sigset_t all, before;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &before);
  thread_ = std::thread([this, launch, options] { main(launch, options); });
  ::pthread_sigmask(SIG_SETMASK, &before, nullptr);
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return ready_; });
  if (error_) {
    lock.unlock();
    thread_.join();
    ::close(event_fd_);
    std::rethrow_exception(error_);
  }
}

NodeAgent::~NodeAgent() {
  // Only reached without finish() when nodalrun failed to run the job: end it everywhere.
  if (thread_.joinable()) finish(1);
  if (event_fd_ >= 0) ::close(event_fd_);
}

HostShare NodeAgent::host_share() const {
  HostShare share;
  const std::string& machine = nodes_[static_cast<std::size_t>(node_rank_)].machine;
  for (int k = 0; k < nnodes(); ++k) {
    const NodeInfo& node = nodes_[static_cast<std::size_t>(k)];
    if (node.machine != machine) continue;
    if (k < node_rank_) share.first += node.local_size;
    share.ranks += node.local_size;
  }
  return share;
}

std::string NodeAgent::label(int node) const {
  return fmt::format("node {} ({})", node, nodes_[static_cast<std::size_t>(node)].host);
}

void NodeAgent::main(const NodeLaunch& launch, const Options& options) {
  try {
    engine_ = InterNode::load();
    if (engine_->size() != launch.nnodes || engine_->rank() != launch.node_rank) {
      throw std::runtime_error(fmt::format("{} says node {} of {}, but {} joined this agent as {} of {}", launch.launcher,
                                           launch.node_rank, launch.nnodes, engine_->engine(), engine_->rank(),
                                           engine_->size()));
    }
    node_rank_ = engine_->rank();
    exchange(options);
  } catch (...) {
    std::lock_guard lock(mutex_);
    error_ = std::current_exception();
    ready_ = true;
    changed_.notify_all();
    return;
  }
  const auto now = SteadyClock::now();
  last_heard_.assign(nodes_.size(), now);
  last_beat_ = now;
  {
    std::lock_guard lock(mutex_);
    ready_ = true;
    changed_.notify_all();
  }
  try {
    // Heartbeats go on while this node sets up its ranks (serve) and after they are done (finish).
    wait_polling([&] { return arena_ != nullptr || finishing_; });
    if (arena_) {
      try {
        serve_steps();
      } catch (...) {
        end_p2p(false);
        throw;
      }
      end_p2p(true);
    }
    {
      std::lock_guard lock(mutex_);
      serving_ = false;  // the arena may go now
      changed_.notify_all();
    }
    wait_polling([&] { return finishing_; });
    int code;
    {
      std::lock_guard lock(mutex_);
      code = finish_code_;
    }
    // The end: every node meets before leaving (heartbeats and failures still flow meanwhile).
    if (code == 0) {
      engine_->barrier_start();
      wait_collective(false);
      bool failed;
      {
        std::lock_guard lock(mutex_);
        failed = remote_.has_value();
      }
      if (!failed) {
        engine_->finalize();  // on the thread that joined (MPI_Finalize belongs to MPI_Init's thread)
        std::lock_guard lock(mutex_);
        finished_ = true;
        changed_.notify_all();
        return;
      }
    }
    poll();  // what finish() queued for the other nodes goes out
  } catch (const std::exception& e) {
    set_remote_failure({kNodeLostExitCode, fmt::format("the link to the other nodes failed: {}", e.what())});
  }
  std::lock_guard lock(mutex_);
  serving_ = false;  // also when the engine threw while serving: stop_serving() waits for it
  finished_ = true;
  changed_.notify_all();
}

void NodeAgent::exchange(const Options& options) {
  NodeRecord mine{};
  mine.local_size = options.nprocs;
  const std::string host = host_name();
  std::snprintf(mine.host, sizeof mine.host, "%s", host.c_str());
  std::snprintf(mine.machine, sizeof mine.machine, "%s", machine_id().c_str());
  std::snprintf(mine.master_addr, sizeof mine.master_addr, "%s", options.master_addr.value_or("").c_str());
  // Where torch's TCPStore listens (rank 0, on node 0): a port free there on every interface.
  mine.master_port = engine_->rank() == 0 ? free_port(PortScope::any_interface) : 0;
  const char* buffer_text = std::getenv("NODAL_NODE_BUFFER_BYTES");
  mine.buffer_bytes = buffer_text ? detail::parse_bytes(buffer_text) : detail::kNodeBufferBytes;
  mine.direct_max_nodes = env_count("NODAL_NODE_DIRECT_MAX_NODES", kDirectAllgatherNodes);
  const char* fold_text = std::getenv("NODAL_NODE_FOLD_MIN_BYTES");
  mine.fold_min_bytes = !fold_text                        ? detail::kNodeFoldMinBytes
                        : std::string_view(fold_text) == "off" ? UINT64_MAX
                                                               : detail::parse_bytes(fold_text);
  std::vector<NodeRecord> all(static_cast<std::size_t>(engine_->size()));
  engine_->allgather_start(&mine, all.data(), sizeof mine);
  while (!engine_->test()) std::this_thread::sleep_for(std::chrono::microseconds(50));
  int next = 0;
  for (const NodeRecord& r : all) {
    const auto node = &r - all.data();
    nodes_.push_back({r.local_size, next, std::string(r.host, strnlen(r.host, sizeof r.host)),
                      std::string(r.machine, strnlen(r.machine, sizeof r.machine))});
    next += r.local_size;
    if (std::strncmp(r.master_addr, all[0].master_addr, sizeof r.master_addr) != 0) {
      throw UsageError(fmt::format("--master-addr differs between nodes: node 0 gave '{}', node {} '{}'",
                                   all[0].master_addr, node, r.master_addr));
    }
    if (r.buffer_bytes != all[0].buffer_bytes) {
      throw UsageError(fmt::format("NODAL_NODE_BUFFER_BYTES differs between nodes: node 0 has {}, node {} {}",
                                   all[0].buffer_bytes, node, r.buffer_bytes));
    }
    if (r.direct_max_nodes != all[0].direct_max_nodes) {
      throw UsageError(fmt::format("NODAL_NODE_DIRECT_MAX_NODES differs between nodes: node 0 has {}, node {} {}",
                                   all[0].direct_max_nodes, node, r.direct_max_nodes));
    }
    if (r.fold_min_bytes != all[0].fold_min_bytes) {
      auto text = [](std::uint64_t v) { return v == UINT64_MAX ? std::string("off") : std::to_string(v); };
      throw UsageError(fmt::format("NODAL_NODE_FOLD_MIN_BYTES differs between nodes: node 0 has {}, node {} {}",
                                   text(all[0].fold_min_bytes), node, text(r.fold_min_bytes)));
    }
  }
  world_size_ = next;
  master_addr_ = all[0].master_addr[0] ? std::string(all[0].master_addr) : nodes_[0].host;
  master_port_ = all[0].master_port;
  buffer_bytes_ = static_cast<std::size_t>(all[0].buffer_bytes);
  // Every step's first round has room for the same bytes on every node: a description and the
  // largest node's ranks' parts of a small step.
  int largest = 1;
  for (const NodeInfo& node : nodes_) largest = std::max(largest, node.local_size);
  direct_max_nodes_ = all[0].direct_max_nodes;
  const std::size_t room = nnodes() <= direct_max_nodes_ ? kOneRoundNodeBytes : kLibraryRoundNodeBytes;
  small_step_bytes_ = room / static_cast<std::size_t>(largest);
  block_bytes_ = sizeof(detail::BridgeStep) + room;
  fold_min_bytes_ = all[0].fold_min_bytes;
}

void NodeAgent::serve(Arena& arena) {
  const std::size_t capacity = buffer_bytes_;
  const int local = nodes_[static_cast<std::size_t>(node_rank_)].local_size;
  void* where = arena.find_or_create(detail::kNodeBridgeName, detail::NodeBridge::bytes_for(local), 64, [&](void* p) {
    auto* b = new (p) detail::NodeBridge();
    b->node_rank = node_rank_;
    b->nnodes = nnodes();
    b->local_size = local;
    b->world_size = world_size_;
    b->first_rank = first_rank();
    b->capacity = capacity;
    b->fold_min_bytes = std::max<std::uint64_t>(fold_min_bytes_, small_step_bytes_ + 1);
    for (int j = 0; j < local; ++j) new (&b->ranks()[j]) detail::BridgeRank();
  });
  auto* bridge = static_cast<detail::NodeBridge*>(where);
  for (std::uint64_t& offset : bridge->buffer_offset) offset = arena.offset_of(arena.allocate(capacity, 4096));
  // The table of channels towards other nodes' ranks (node_bridge.hpp), zero before ranks start:
  // room for every pair of the world and of three more communicators as large.
  const std::size_t entries = std::max<std::size_t>(4096, 4 * static_cast<std::size_t>(local) * world_size_);
  void* table = arena.allocate(entries * sizeof(std::uint64_t), 64);
  for (std::size_t i = 0; i < entries; ++i) new (static_cast<std::atomic<std::uint64_t>*>(table) + i) std::atomic<std::uint64_t>(0);
  bridge->p2p_table_offset = arena.offset_of(table);
  bridge->p2p_capacity = entries;
  std::lock_guard lock(mutex_);
  bridge_ = bridge;
  arena_ = &arena;
  serving_ = true;
  changed_.notify_all();
}

bool NodeAgent::stopping() const {
  std::lock_guard lock(mutex_);
  return stop_serving_ || finishing_ || remote_.has_value();
}

void NodeAgent::stop_serving() {
  std::unique_lock lock(mutex_);
  stop_serving_ = true;
  changed_.wait(lock, [&] { return !serving_; });
}

void NodeAgent::serve_steps() {
  detail::NodeBridge& b = *bridge_;
  auto all_posted = [&b](std::uint64_t step) {
    for (int j = 0; j < b.local_size; ++j) {
      if (b.ranks()[j].posted.load(std::memory_order_acquire) < step) return false;
    }
    return true;
  };
  block_.assign(block_bytes_, std::byte{0});
  blocks_.assign(block_bytes_ * nodes_.size(), std::byte{0});
  std::vector<int> bounds;
  for (const NodeInfo& node : nodes_) bounds.push_back(node.first_rank);
  bounds.push_back(world_size_);
  relay_ = std::make_unique<P2PRelay>(*arena_, b, *engine_, std::move(bounds), node_rank_);
  for (; !early_p2p_.empty(); early_p2p_.pop_front()) relay_->on_notice(early_p2p_.front().first, early_p2p_.front().second);
  // The agent sleeps on the bridge's word only while no send/recv across nodes needs it; a rank
  // entering one wakes it (p2p_active).
  auto rest = [&](const std::function<bool()>& ready) {
    if (p2p_busy()) {
      if (p2p_hot()) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
      return ready();
    }
    return detail::sleep_on(b.word, [&] { return ready() || p2p_busy(); }, std::chrono::milliseconds(20)) && ready();
  };
  std::uint64_t step = 1;
  while (!stopping()) {
    poll();
    progress_p2p();
    if (const std::uint64_t failed = b.mismatch.load(std::memory_order_acquire); failed != 0) {
      // Step `failed` did not match: once every rank of this node has seen it (node_bridge.hpp),
      // step failed + 1 is skipped here as on every node, and the ranks go on.
      auto all_resynced = [&b, failed] {
        for (int j = 0; j < b.local_size; ++j) {
          if (b.ranks()[j].resynced.load(std::memory_order_acquire) < failed) return false;
        }
        return true;
      };
      if (rest(all_resynced)) {
        b.done.store(failed + 1, std::memory_order_release);
        b.mismatch.store(0, std::memory_order_release);
        detail::notify(b.word);
        step = failed + 2;
      }
      continue;
    }
    // Calls come back to back in a loop: look for the next one, yielding, for kHotWait before
    // sleeping on the bridge's word (a futex wake costs tens of microseconds here).
    bool posted = false;
    for (const auto hot_until = SteadyClock::now() + kHotWait; !posted && SteadyClock::now() < hot_until;) {
      posted = all_posted(step);
      if (!posted) {
        if (p2p_busy()) {
          poll();  // the other agents' answers come as notices
          progress_p2p();
        }
        std::this_thread::yield();
      }
    }
    if (posted || rest([&] { return all_posted(step); })) {
      if (!serve_step(step)) return;
      ++step;
    }
  }
}

bool NodeAgent::serve_step(std::uint64_t s) {
  detail::NodeBridge& b = *bridge_;
  detail::BridgeRank* ranks = b.ranks();
  detail::BridgeStep step = ranks[0].steps[s % 2];
  std::string local_mismatch;
  for (int j = 1; j < b.local_size; ++j) {
    if (!(ranks[j].steps[s % 2] == step)) {
      local_mismatch = fmt::format("ranks {} and {} on {} made different calls: {} and {}", b.first_rank,
                                   b.first_rank + j, label(node_rank_), describe_step(step), describe_step(ranks[j].steps[s % 2]));
      step.kind = 0xff;  // every node then sees the mismatch
      break;
    }
  }
  auto* buffer = static_cast<std::byte*>(arena_->at(b.buffer_offset[s % detail::kNodeBuffers]));
  const NodeInfo& me = nodes_[static_cast<std::size_t>(node_rank_)];
  const auto shape = static_cast<detail::StepShape>(step.shape);
  int root_node = 0;
  if (shape == detail::StepShape::rooted) {
    while (root_node + 1 < nnodes() && nodes_[static_cast<std::size_t>(root_node + 1)].first_rank <= step.root) ++root_node;
  }
  // What this node contributes to the step, at `buffer + my_offset` (non-rooted: its ranks'
  // parts; rooted: the root's, on the root's node only).
  auto contribution = [&](const NodeInfo& node, int k) -> std::pair<std::size_t, std::size_t> {
    if (shape == detail::StepShape::rooted) return {0, k == root_node ? step.bytes : 0};
    return {static_cast<std::size_t>(node.first_rank) * step.bytes, static_cast<std::size_t>(node.local_size) * step.bytes};
  };
  const bool small = step.bytes <= small_step_bytes_;
  std::memcpy(block_.data(), &step, sizeof step);
  std::size_t block_length = sizeof step;
  if (small && local_mismatch.empty()) {
    const auto [offset, length] = contribution(me, node_rank_);
    if (length > 0) std::memcpy(block_.data() + sizeof step, buffer + offset, length);
    block_length += length;
  }
  allgather_blocks(block_length);
  wait_collective(true);
  if (stopping()) return false;
  // Every node's message starts with its description (checked whole below, once the descriptions
  // agree): a shorter one would leave an earlier step's description to compare.
  auto fault = [&](const nodal_internode_transfer& t, std::size_t want) {
    return std::runtime_error(fmt::format("step {}: {} sent {} bytes where its description and data take {}", s,
                                          label(t.peer), t.received, want));
  };
  const bool direct = nnodes() <= direct_max_nodes_;
  for (std::size_t i = 0; direct && i < transfers_.size(); ++i) {
    const nodal_internode_transfer& t = transfers_[i];
    if (t.kind == NODAL_INTERNODE_RECV_UP_TO && t.received < sizeof step) throw fault(t, sizeof step);
  }
  std::vector<detail::BridgeStep> steps(nodes_.size());
  for (std::size_t k = 0; k < steps.size(); ++k) std::memcpy(&steps[k], blocks_.data() + k * block_bytes_, sizeof step);
  for (std::size_t k = 1; k < steps.size() && local_mismatch.empty(); ++k) {
    if (!(steps[k] == steps[0])) {
      local_mismatch = steps[k].kind == 0xff || steps[0].kind == 0xff
                           ? fmt::format("the ranks of {} made different calls", label(steps[0].kind == 0xff ? 0 : static_cast<int>(k)))
                           : fmt::format("the nodes made different calls: {} on {}, {} on {}", describe_step(steps[0]),
                                         label(0), describe_step(steps[k]), label(static_cast<int>(k)));
    }
  }
  if (!local_mismatch.empty()) {
    std::snprintf(b.message, sizeof b.message, "%s", local_mismatch.c_str());
    b.mismatch.store(s, std::memory_order_release);
    detail::notify(b.word);
    return true;  // every rank throws UsageError, then serve_steps skips s + 1 (node_bridge.hpp)
  }
  if (direct) {
    // Every node sent its description and, in a small step, its part: anything else is a fault
    // between the agents, which must not reach the ranks as stale bytes of an earlier step.
    for (const nodal_internode_transfer& t : transfers_) {
      if (t.kind != NODAL_INTERNODE_RECV_UP_TO) continue;
      const std::size_t want = sizeof step + (small ? contribution(nodes_[static_cast<std::size_t>(t.peer)], t.peer).second : 0);
      if (t.received != want) throw fault(t, want);
    }
  }
  if (small) {
    // The data came with the descriptions: put the other nodes' parts where the ranks read them.
    for (int k = 0; k < nnodes(); ++k) {
      const auto [offset, length] = contribution(nodes_[static_cast<std::size_t>(k)], k);
      if (k != node_rank_ && length > 0) {
        std::memcpy(buffer + offset, blocks_.data() + static_cast<std::size_t>(k) * block_bytes_ + sizeof step, length);
      }
    }
  } else if (shape == detail::StepShape::folded) {
    if (!fold_step(step, buffer, ranks[0].float_mode[s % 2])) return false;
  } else if (nnodes() <= direct_max_nodes_) {
    const auto [mine, my_length] = contribution(me, node_rank_);
    exchange_with_every_node(buffer + mine, my_length, [&](int k) {
      const auto [offset, length] = contribution(nodes_[static_cast<std::size_t>(k)], k);
      return std::pair{buffer + offset, length};
    });
    wait_collective(true);
  } else if (shape == detail::StepShape::rooted) {
    engine_->broadcast_start(buffer, step.bytes, root_node);
    wait_collective(true);
  } else {
    std::vector<std::uint64_t> counts, displs;
    for (int k = 0; k < nnodes(); ++k) {
      const auto [offset, length] = contribution(nodes_[static_cast<std::size_t>(k)], k);
      counts.push_back(length);
      displs.push_back(offset);
    }
    engine_->allgatherv_start(buffer, counts.data(), displs.data());
    wait_collective(true);
  }
  if (stopping()) return false;
  b.done.store(s, std::memory_order_release);
  detail::notify(b.word);
  return true;
}

void NodeAgent::allgather_blocks(std::size_t length) {
  std::memcpy(blocks_.data() + static_cast<std::size_t>(node_rank_) * block_bytes_, block_.data(), length);
  if (nnodes() > direct_max_nodes_) return engine_->allgather_start(block_.data(), blocks_.data(), block_bytes_);
  exchange_with_every_node(
      block_.data(), length,
      [&](int k) { return std::pair{blocks_.data() + static_cast<std::size_t>(k) * block_bytes_, block_bytes_}; },
      NODAL_INTERNODE_RECV_UP_TO);
}

void NodeAgent::exchange_with_every_node(std::byte* mine, std::size_t my_bytes,
                                         const std::function<std::pair<std::byte*, std::size_t>(int)>& theirs,
                                         int receive) {
  transfers_.clear();
  for (int k = 0; k < nnodes(); ++k) {
    if (k == node_rank_) continue;
    const auto [at, bytes] = theirs(k);
    if (bytes > 0) transfers_.push_back({k, receive, at, bytes, 0});
    if (my_bytes > 0) transfers_.push_back({k, NODAL_INTERNODE_SEND, mine, my_bytes, 0});
  }
  engine_->exchange_start(transfers_);
}

void NodeAgent::wait_collective(bool serving) {
  // A step between nodes takes microseconds, and this node's ranks sleep until it ends: the agent
  // polls the engine, yielding the core between polls, for up to kSpin; then in naps of 50 us so
  // that a long wait (another node still computing) does not take a core from the ranks.
  constexpr auto kSpin = std::chrono::milliseconds(2);
  const auto spin_until = SteadyClock::now() + kSpin;
  for (int round = 0;; ++round) {
    if (engine_->test()) return;
    progress_p2p();
    if (round % 64 == 0 || p2p_busy()) {
      poll();
      std::lock_guard lock(mutex_);
      // The job is over: the collective may never complete. (The end's barrier is not given up
      // when the ranks are done: that is when it runs.)
      if (remote_ || (serving && stop_serving_)) return;
    }
    if (SteadyClock::now() < spin_until || p2p_hot()) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

void NodeAgent::wait_polling(const std::function<bool()>& done) {
  std::unique_lock lock(mutex_);
  while (!changed_.wait_for(lock, std::chrono::milliseconds(20), done)) {
    lock.unlock();
    poll();
    lock.lock();
  }
}

void NodeAgent::poll() {
  std::deque<std::string> out;
  {
    std::lock_guard lock(mutex_);
    out.swap(outgoing_);
  }
  for (const std::string& notice : out) {
    for (int k = 0; k < nnodes(); ++k) {
      if (k != node_rank_) engine_->send_notice(k, notice);
    }
  }
  const auto now = SteadyClock::now();
  while (std::optional<std::pair<int, std::string>> notice = engine_->poll_notice()) {
    const auto& [from, text] = *notice;
    last_heard_[static_cast<std::size_t>(from)] = now;
    if (!text.empty() && text[0] == P2PRelay::kNotice) {
      if (relay_) {
        relay_->on_notice(from, text);
      } else if (!p2p_ended_) {
        early_p2p_.emplace_back(from, text);  // this node's ranks have not started yet
      }
    } else if (!text.empty() && text[0] == kFailure) {
      int code = 1;
      const char* space = std::strchr(text.c_str(), ' ');
      std::from_chars(text.data() + 1, space ? space : text.data() + text.size(), code);
      set_remote_failure({code, space ? std::string(space + 1) : text});
    }
  }
  if (now - last_beat_ >= node_timeout_ / 4) {
    for (int k = 0; k < nnodes(); ++k) {
      if (k != node_rank_) engine_->send_notice(k, std::string(1, kHeartbeat));
    }
    last_beat_ = now;
  }
  for (int k = 0; k < nnodes(); ++k) {
    if (k != node_rank_ && now - last_heard_[static_cast<std::size_t>(k)] > node_timeout_) {
      set_remote_failure({kNodeLostExitCode,
                          fmt::format("{} was lost: nothing heard from it for {:g} s (NODAL_NODE_TIMEOUT)", label(k),
                                      node_timeout_.count())});
      last_heard_[static_cast<std::size_t>(k)] = now;  // said once
    }
  }
}

void NodeAgent::progress_p2p() {
  if (!relay_) return;
  relay_->progress();
  if (relay_->activity() != p2p_activity_) {
    p2p_activity_ = relay_->activity();
    p2p_hot_until_ = SteadyClock::now() + kP2PHot;
  }
}

bool NodeAgent::p2p_hot() const { return relay_ && SteadyClock::now() < p2p_hot_until_; }

void NodeAgent::end_p2p(bool ranks_done) {
  if (!relay_) return;
  // A rank that received a message's last chunk may have exited before the agent told the
  // sender's node: its acks are final now, and the answer still goes. A one-chunk message that
  // its receiver refused still crosses into the receiver's ring (p2p_relay.hpp): both agents go
  // on until it has, the other node's agent being in its steps or here.
  if (ranks_done) {
    relay_->progress();
    const auto deadline = SteadyClock::now() + kP2PDrain;
    while (relay_->in_flight() && SteadyClock::now() < deadline) {
      poll();
      {
        std::lock_guard lock(mutex_);
        if (remote_) break;
      }
      std::this_thread::yield();
      relay_->progress();
    }
  }
  if (!relay_->cancel()) {
    // Only when the job failed mid-message (after a clean run nothing is in flight: every send
    // is a rendezvous, and a refused one-chunk message is drained above); the launcher's abort
    // follows.
    detail::write_all(STDERR_FILENO, "nodalrun: the MPI engine did not release send/recv buffers in the arena when "
                                     "cancelled\n");
  }
  relay_.reset();
  p2p_ended_ = true;
}

void NodeAgent::set_remote_failure(RemoteFailure failure) {
  std::lock_guard lock(mutex_);
  if (remote_) return;
  remote_ = std::move(failure);
  const std::uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(event_fd_, &one, sizeof one);
}

std::optional<RemoteFailure> NodeAgent::remote_failure() {
  std::uint64_t count;
  [[maybe_unused]] ssize_t n = ::read(event_fd_, &count, sizeof count);
  std::lock_guard lock(mutex_);
  if (!remote_ || remote_taken_) return std::nullopt;
  remote_taken_ = true;
  return remote_;
}

void NodeAgent::announce_failure(int global_rank, int exit_code, const std::string& detail) {
  const std::string who = global_rank >= 0 ? fmt::format("rank {} on {}", global_rank, label(node_rank_)) : label(node_rank_);
  std::lock_guard lock(mutex_);
  outgoing_.push_back(fmt::format("{}{} {} failed first: {}", kFailure, exit_code, who, detail));
}

int NodeAgent::finish(int exit_code) {
  stop_serving();
  {
    std::lock_guard lock(mutex_);
    finishing_ = true;
    finish_code_ = exit_code;
    changed_.notify_all();
  }
  if (exit_code == 0) {
    thread_.join();
    std::lock_guard lock(mutex_);
    if (!remote_) return 0;  // the thread has left the job
    exit_code = remote_->exit_code;
    detail::write_all(STDERR_FILENO, fmt::format("nodalrun: this node's ranks succeeded, but {}\n", remote_->detail));
  } else {
    // The thread sends what is queued, unless it is stuck in the engine (a lost link): then the
    // abort below ends the job regardless.
    std::unique_lock lock(mutex_);
    changed_.wait_for(lock, std::chrono::seconds(1), [&] { return finished_; });
  }
  std::thread([exit_code] {
    std::this_thread::sleep_for(std::chrono::seconds(5));
    std::_Exit(exit_code);
  }).detach();
  // The launcher forwards our output (the report above) asynchronously and drops what it has not
  // forwarded when the job is aborted: under srun both nodes' reports were lost in 1 of 2 runs.
  if (exit_code != 0) std::this_thread::sleep_for(kOutputGrace);
  engine_->abort(exit_code);
  std::_Exit(exit_code);
}

}  // namespace nodal::launcher
