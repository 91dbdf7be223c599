// Shared-memory collectives (DESIGN.md "Collectives"). Every call starts the same way: each rank
// publishes a CallHeader (what it calls, with what count, dtype, op and root, and where its
// buffers are when they are in the arena) in its slot for this call's parity, a small call's data
// right behind it, then waits for every member's header of the same call and compares them.
//
// Why this one exchange is enough to reuse every shared buffer safely: a rank can publish the
// header of call k only after it finished call k-1; so once a rank has seen every header of call
// k, nobody reads anything of call k-1 any more (staging ring, results, peers' buffers), and the
// slots of parity k%2 were last read in call k-2. Within a pipelined call, ring entries are reused
// only after every reader has published `consumed` for the step that used them.
#include "shm/algorithms.hpp"

#include "copy.hpp"
#include "reduce_kernels.hpp"
#include "shm/vector_collectives.hpp"

#include <nodal/errors.hpp>
#include <nodal/detail/posix.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <sys/uio.h>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace nodal::detail {
namespace {

enum class Algorithm { small, pipelined, in_place, cma };

/// Copies of at least this many bytes per rank read private peer buffers with one
/// process_vm_readv (a single copy, like Open MPI's and MPICH's CMA path) instead of staging
/// them: below it the system call costs more than the second copy.
constexpr std::size_t kCmaMinBytes = 64 * 1024;

const char* algorithm_name(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::small: return "small";
    case Algorithm::pipelined: return "pipelined";
    case Algorithm::in_place: return "in_place";
    case Algorithm::cma: return "cma";
  }
  return "?";
}

/// An algorithm forced by the environment, or automatic choice.
enum class Forced { none, small, pipelined, in_place };

Forced parse_forced(const char* variable) {
  std::string value = getenv_or_empty(variable);
  if (value.empty() || value == "auto") return Forced::none;
  if (value == "small") return Forced::small;
  if (value == "pipelined") return Forced::pipelined;
  if (value == "in_place") return Forced::in_place;
  throw UsageError(fmt::format("{}='{}': use auto, small, pipelined or in_place", variable, value));
}

/// NODAL_ALLREDUCE_ALGO for allreduce, else NODAL_ALGO (read once).
Forced forced_algorithm(CollKind kind) {
  static const Forced all = parse_forced("NODAL_ALGO");
  static const Forced allreduce = parse_forced("NODAL_ALLREDUCE_ALGO");
  return kind == CollKind::allreduce && allreduce != Forced::none ? allreduce : all;
}

/// Room for the per-peer source pointers of a reduction without a heap allocation per call.
class Sources {
 public:
  explicit Sources(int n) : heap_(n > kInline ? static_cast<std::size_t>(n) : 0) {}
  const void*& operator[](int j) { return heap_.empty() ? inline_[j] : heap_[j]; }
  const void* const* data() const { return heap_.empty() ? inline_ : heap_.data(); }

 private:
  static constexpr int kInline = 64;
  const void* inline_[kInline];
  std::vector<const void*> heap_;
};

std::byte* bytes(void* p) { return static_cast<std::byte*>(p); }
const std::byte* bytes(const void* p) { return static_cast<const std::byte*>(p); }


std::size_t ceil_div(std::size_t a, std::size_t b) { return (a + b - 1) / b; }

/// What a rank puts in its slot on the small path, in bytes.
std::size_t contribution_bytes(const CollCall& call, int world_size, int rank) {
  const std::size_t n = call.count * element_size(call.dtype);
  switch (call.kind) {
    case CollKind::barrier: return 0;
    case CollKind::allreduce:
    case CollKind::reduce:
    case CollKind::allgather:
    case CollKind::gather:
    case CollKind::split: return n;
    case CollKind::broadcast: return rank == call.root ? n : 0;
    case CollKind::scatter: return rank == call.root ? n * static_cast<std::size_t>(world_size) : 0;
    case CollKind::reduce_scatter:
    case CollKind::alltoall: return n * static_cast<std::size_t>(world_size);
    default: return 0;  // the v-variants stage elsewhere
  }
}

/// The largest slot contribution of any rank: the same number on every rank.
std::size_t largest_contribution(const CollCall& call, int world_size) {
  std::size_t most = 0;
  for (int r = 0; r < world_size; ++r) most = std::max(most, contribution_bytes(call, world_size, r));
  return most;
}

bool is_reduction(CollKind kind) {
  return kind == CollKind::allreduce || kind == CollKind::reduce || kind == CollKind::reduce_scatter ||
         kind == CollKind::reduce_scatterv;
}

std::string describe(const CallHeader& h) {
  std::string text = fmt::format("{}(count={}, dtype={}", coll_kind_name(h.kind), h.count, dtype_name(h.dtype));
  if (is_reduction(h.kind)) text += fmt::format(", op={}", reduce_op_name(h.op));
  if (h.root >= 0) text += fmt::format(", root={}", h.root);
  if (h.on_gpu) text += ", on cuda tensors";
  return text + ")";
}

/// One call in progress on one rank.
class Call {
 public:
  Call(CommState& comm, const CollCall& call)
      : c_(comm), call_(call), n_(comm.size), r_(comm.rank), esize_(element_size(call.dtype)) {}

  void run() {
    check_job_alive();
    if (is_vector(call_.kind)) {
      // Staged before the call counts as made: a ShmError here leaves the sequence as it was.
      staged_ = stage_vector_call(c_, call_, c_.seq + 1);
      seq_ = ++c_.seq;
      publish_header(false);
      exchange_headers();
      c_.last_algorithm.store("staged", std::memory_order_relaxed);
      finish_vector_call(c_, call_, seq_);
      return;
    }
    seq_ = ++c_.seq;
    const bool small_fits = largest_contribution(call_, n_) <= c_.config.small_max;
    const Forced forced = forced_algorithm(call_.kind);
    const bool small = !call_.on_gpu && small_fits && (forced == Forced::none || forced == Forced::small);
    publish_header(small);
    const bool all_in_arena = exchange_headers();
    if (call_.on_gpu) return;  // agreed: the GPU backend moves the data
    Algorithm algorithm = Algorithm::pipelined;
    if (small) {
      algorithm = Algorithm::small;
    } else if (all_in_arena && forced != Forced::pipelined) {
      algorithm = Algorithm::in_place;
    } else if (!is_reduction(call_.kind) && forced == Forced::none && cma_usable()) {
      algorithm = Algorithm::cma;
    }
    c_.last_algorithm.store(algorithm_name(algorithm), std::memory_order_relaxed);  // a static string: no copy
    if (call_.kind == CollKind::barrier || call_.count == 0) return;
    if (algorithm == Algorithm::small) {
      run_small();
    } else {
      c_.ensure_ring();
      if (is_reduction(call_.kind)) {
        run_pipelined_reduction(algorithm == Algorithm::in_place);
      } else {
        run_pipelined_copy(algorithm);
      }
    }
  }

 private:
  // ---- The header exchange. ----

  void publish_header(bool small) {
    CallHeader& h = c_.header(r_, seq_);
    if (small) {
      std::size_t n = contribution_bytes(call_, n_, r_);
      if (n != 0) std::memcpy(c_.inline_data(r_, seq_), call_.input, n);
    }
    h.kind = call_.kind;
    h.dtype = call_.dtype;
    h.op = call_.op;
    h.root = call_.root;
    h.count = call_.count;
    Arena& arena = *c_.arena;
    h.in_arena = is_vector(call_.kind) || (call_.input != nullptr && arena.contains(call_.input));
    h.input_offset = is_vector(call_.kind) ? staged_
                     : h.in_arena          ? arena.offset_of(call_.input)
                                           : reinterpret_cast<std::uintptr_t>(call_.input);
    h.out_arena = call_.output != nullptr && arena.contains(call_.output);
    h.output_offset = h.out_arena ? arena.offset_of(call_.output) : 0;
    h.on_gpu = call_.on_gpu;
    publish(c_, h.seq, seq_);
  }

  /// Waits for every member's header of this call; throws UsageError on every rank when they
  /// differ. Returns true when the buffers peers would read in place are all in the arena.
  bool exchange_headers() {
    const CallHeader& mine = c_.header(r_, seq_);
    int differs = -1;
    for (int j = 0; j < n_; ++j) {
      if (j == r_) continue;
      const CallHeader& h = c_.header(j, seq_);
      wait_flag(c_, h.seq, seq_, "collective");
      // The v-variants' counts differ by design: finish_vector_call checks them against each other.
      const bool count_differs = h.count != mine.count && !is_vector(mine.kind);
      if (differs < 0 && (h.kind != mine.kind || count_differs || h.dtype != mine.dtype ||
                          h.root != mine.root || h.on_gpu != mine.on_gpu ||
                          (is_reduction(h.kind) && h.op != mine.op))) {
        differs = j;
      }
    }
    if (differs >= 0) {
      // Every rank sees some pair differ, so every rank throws at this same call; the slots of
      // this call are simply never read again and the communicator goes on with the next one.
      throw UsageError(fmt::format(
          "collective mismatch on communicator '{}' (call {}): rank {} called {} but rank {} called {}; every "
          "rank must make the same collective calls in the same order",
          c_.name, seq_, r_, describe(mine), differs, describe(c_.header(differs, seq_))));
    }
    // In place needs every buffer a peer reads: inputs for all; outputs too when peers gather
    // from them (allreduce).
    for (int j = 0; j < n_; ++j) {
      const CallHeader& h = c_.header(j, seq_);
      if (!reads_peer_input(j)) continue;
      if (!h.in_arena) return false;
    }
    if (call_.kind == CollKind::allreduce) {
      for (int j = 0; j < n_; ++j) {
        if (!c_.header(j, seq_).out_arena) return false;
      }
    }
    return true;
  }

  /// Whether some peer reads rank j's input in this call.
  bool reads_peer_input(int j) const {
    switch (call_.kind) {
      case CollKind::broadcast:
      case CollKind::scatter: return j == call_.root;
      default: return true;
    }
  }

  const void* peer_input(int j) const { return c_.arena->at(c_.header(j, seq_).input_offset); }

  /// Every rank whose input a peer reads allows cross-memory attach, and the data is large.
  bool cma_usable() const {
    if (call_.count * esize_ < kCmaMinBytes) return false;
    for (int j = 0; j < n_; ++j) {
      if (reads_peer_input(j) && c_.progress[j].cma == 0) return false;
    }
    return true;
  }

  /// Reads `n` bytes at `address` in rank j's memory into `dst` (process_vm_readv). Throws
  /// PeerFailure when j is gone, Error for any other failure (say which and how to avoid it).
  void cma_read(int j, void* dst, std::uintptr_t address, std::size_t n) const {
    std::size_t done = 0;
    while (done < n) {
      iovec local{static_cast<std::byte*>(dst) + done, n - done};
      iovec remote{reinterpret_cast<void*>(address + done), n - done};
      ssize_t got = ::process_vm_readv(c_.progress[j].pid, &local, 1, &remote, 1, 0);
      if (got <= 0) {
        int error = errno;
        check_job_alive();
        if (error == ESRCH) throw PeerFailure(fmt::format("rank {} of communicator '{}' is gone", j, c_.name));
        throw Error(fmt::format("process_vm_readv from rank {} (pid {}) failed: {}; set NODAL_CMA=0 to stage copies "
                                "through shared memory instead",
                                j, c_.progress[j].pid, std::strerror(error)));
      }
      done += static_cast<std::size_t>(got);
    }
  }
  void* peer_output(int j) const { return c_.arena->at(c_.header(j, seq_).output_offset); }
  Progress& progress(int j) const { return c_.progress[j]; }
  std::uint64_t flag(std::uint64_t step) const { return step_flag(seq_, step); }

  void wait_consumed(int j, std::uint64_t step) { wait_flag(c_, progress(j).consumed, flag(step), "collective"); }

  // ---- Small: everything went into the slots with the headers; read it from there. ----

  void run_small() {
    const std::size_t n = call_.count * esize_;
    switch (call_.kind) {
      case CollKind::allreduce:
      case CollKind::reduce: {
        if (call_.kind == CollKind::reduce && r_ != call_.root) return;
        Sources srcs(n_);
        for (int j = 0; j < n_; ++j) srcs[j] = j == r_ ? call_.input : c_.inline_data(j, seq_);
        reduce_n(call_.dtype, call_.op, call_.output, srcs.data(), n_, call_.count);
        return;
      }
      case CollKind::reduce_scatter: {
        Sources srcs(n_);
        for (int j = 0; j < n_; ++j) srcs[j] = (j == r_ ? bytes(call_.input) : c_.inline_data(j, seq_)) + r_ * n;
        reduce_n(call_.dtype, call_.op, call_.output, srcs.data(), n_, call_.count);
        return;
      }
      case CollKind::broadcast:
        if (r_ != call_.root) std::memcpy(call_.output, c_.inline_data(call_.root, seq_), n);
        return;
      case CollKind::allgather:
      case CollKind::gather:
      case CollKind::split:
        if (call_.kind == CollKind::gather && r_ != call_.root) return;
        for (int j = 0; j < n_; ++j) copy_bytes(bytes(call_.output) + j * n, j == r_ ? call_.input : c_.inline_data(j, seq_), n);
        return;
      case CollKind::scatter:
        copy_bytes(call_.output, (r_ == call_.root ? bytes(call_.input) : c_.inline_data(call_.root, seq_)) + r_ * n, n);
        return;
      case CollKind::alltoall:
        for (int j = 0; j < n_; ++j) {
          copy_bytes(bytes(call_.output) + j * n, (j == r_ ? bytes(call_.input) : c_.inline_data(j, seq_)) + r_ * n, n);
        }
        return;
      case CollKind::barrier: return;
      default: return;  // the v-variants never take this path
    }
  }

  // ---- Pipelined reductions: reduce-scatter (+ all-gather) in steps through the ring. ----

  /// Block b of step i: where it is in the input and output (elements) and in a ring entry (bytes).
  struct Piece {
    std::size_t in;
    std::size_t out;
    std::size_t len;
    std::size_t ring;
  };

  /// Elements per block per step: whole cache lines, and world_size blocks fit one ring entry.
  std::size_t block_elements(std::size_t blocks) const {
    std::size_t lines = c_.config.chunk_bytes / kCacheLine / blocks;
    return std::max<std::size_t>(lines, 1) * kCacheLine / esize_;
  }

  void run_pipelined_reduction(bool in_place) {
    const std::size_t per_block = block_elements(static_cast<std::size_t>(n_));
    const std::size_t line = kCacheLine / esize_;
    const bool scatter = call_.kind == CollKind::reduce_scatter;
    const std::size_t step_elements = scatter ? per_block : per_block * n_;
    const std::size_t steps = ceil_div(call_.count, step_elements);
    auto piece = [&](std::size_t i, int b) -> Piece {
      if (scatter) {
        std::size_t begin = i * per_block;
        std::size_t len = std::min(per_block, call_.count - begin);
        return {b * call_.count + begin, begin, len, b * per_block * esize_};
      }
      std::size_t base = i * step_elements;
      std::size_t len = std::min(step_elements, call_.count - base);
      std::size_t block = std::min(per_block, ceil_div(ceil_div(len, n_), line) * line);
      std::size_t begin = std::min(len, b * block);
      std::size_t end = std::min(len, (b + 1) * block);
      return {base + begin, base + begin, end - begin, b * block * esize_};
    };
    // Who gathers the reduced blocks: everyone (allreduce), the root (reduce), nobody.
    const bool gather_all = call_.kind == CollKind::allreduce;
    const bool gathers = gather_all || (call_.kind == CollKind::reduce && r_ == call_.root);
    const bool any_gather = call_.kind != CollKind::reduce_scatter;
    // In place, peers read inputs where they are; allreduce's peers gather from outputs too.
    const bool direct_out = in_place && gather_all;
    // Outputs nobody reads soon (the gathered blocks; my own block unless peers gather it from
    // my output) are written with streaming stores when the message is large.
    const bool stream = call_.count * esize_ >= kStreamMinBytes;
    const bool uses_ring = !in_place || (any_gather && !direct_out);
    Sources srcs(n_);
    for (std::size_t i = 0; i < steps; ++i) {
      if (uses_ring && i >= static_cast<std::size_t>(c_.config.ring_depth)) {
        for (int j = 0; j < n_; ++j) {
          if (j != r_) wait_consumed(j, i - c_.config.ring_depth);
        }
      }
      const Piece mine = piece(i, r_);
      if (!in_place) {
        for (int b = 0; b < n_; ++b) {
          if (b == r_) continue;
          Piece p = piece(i, b);
          std::memcpy(c_.stage(r_, i) + p.ring, bytes(call_.input) + p.in * esize_, p.len * esize_);
        }
        publish(c_, progress(r_).posted, flag(i));
      }
      for (int j = 0; j < n_; ++j) {
        if (j == r_) {
          srcs[j] = bytes(call_.input) + mine.in * esize_;
        } else if (in_place) {
          srcs[j] = bytes(peer_input(j)) + mine.in * esize_;
        } else {
          wait_flag(c_, progress(j).posted, flag(i), "collective");
          srcs[j] = c_.stage(j, i) + mine.ring;
        }
      }
      // Where my reduced block goes: my output when I keep it (and peers read it there in place),
      // else the result ring, copied to my output if I gather.
      const bool to_output = scatter || direct_out || (call_.kind == CollKind::reduce && r_ == call_.root);
      void* dst = to_output ? static_cast<void*>(bytes(call_.output) + mine.out * esize_) : c_.result(r_, i) + mine.ring;
      reduce_n(call_.dtype, call_.op, dst, srcs.data(), n_, mine.len, stream && to_output && !direct_out);
      if (any_gather) {
        if (!to_output && gathers) copy_bytes(bytes(call_.output) + mine.out * esize_, dst, mine.len * esize_, stream);
        publish(c_, progress(r_).reduced, flag(i));
      }
      if (gathers) {
        for (int b = 0; b < n_; ++b) {
          if (b == r_) continue;
          wait_flag(c_, progress(b).reduced, flag(i), "collective");
          Piece p = piece(i, b);
          const std::byte* from = direct_out ? bytes(peer_output(b)) + p.out * esize_ : c_.result(b, i) + p.ring;
          copy_bytes(bytes(call_.output) + p.out * esize_, from, p.len * esize_, stream);
        }
      }
      publish(c_, progress(r_).consumed, flag(i));
    }
    // Peers read my own buffers in place: they must be done before the caller gets them back.
    if (in_place && steps > 0) {
      for (int j = 0; j < n_; ++j) {
        if (j != r_) wait_consumed(j, steps - 1);
      }
    }
  }

  // ---- Pipelined copies: producers stage slices, consumers copy them out. ----

  void run_pipelined_copy(Algorithm algorithm) {
    // in_place: peers' inputs are in the arena, read them there; cma: read them where they are
    // with process_vm_readv, in one step; pipelined: stage them through the ring.
    const bool in_place = algorithm == Algorithm::in_place;
    const bool cma = algorithm == Algorithm::cma;
    const bool direct = in_place || cma;
    const CollKind kind = call_.kind;
    const bool rooted_producer = kind == CollKind::broadcast || kind == CollKind::scatter;
    const bool rooted_consumer = kind == CollKind::gather;
    const bool per_consumer = kind == CollKind::scatter || kind == CollKind::alltoall;
    auto producer = [&](int j) { return !rooted_producer || j == call_.root; };
    auto consumer = [&](int j) {
      if (kind == CollKind::broadcast) return j != call_.root;
      return !rooted_consumer || j == call_.root;
    };
    const std::size_t slots = per_consumer ? static_cast<std::size_t>(n_) : 1;
    const std::size_t per_step = cma ? call_.count : block_elements(slots);
    const std::size_t steps = ceil_div(call_.count, per_step);
    // Element offsets: of the block producer p sends to consumer q in p's input, and of what q
    // receives from p in q's output.
    auto in_block = [&](int q) -> std::size_t { return per_consumer ? q * call_.count : 0; };
    auto out_block = [&](int p) -> std::size_t { return rooted_producer ? 0 : p * call_.count; };
    const std::size_t esize = esize_;
    const bool stream = call_.count * esize >= kStreamMinBytes;
    // My own block needs no staging.
    if (producer(r_) && consumer(r_)) {
      copy_bytes(bytes(call_.output) + out_block(r_) * esize, bytes(call_.input) + in_block(r_) * esize, call_.count * esize);
    }
    bool i_produce = false;
    for (int q = 0; q < n_; ++q) i_produce = i_produce || (producer(r_) && q != r_ && consumer(q));
    for (std::size_t i = 0; i < steps; ++i) {
      const std::size_t begin = i * per_step;
      const std::size_t len = std::min(per_step, call_.count - begin);
      if (i_produce && !direct) {
        if (i >= static_cast<std::size_t>(c_.config.ring_depth)) {
          for (int q = 0; q < n_; ++q) {
            if (q != r_ && consumer(q)) wait_consumed(q, i - c_.config.ring_depth);
          }
        }
        for (int q = 0; q < (per_consumer ? n_ : 1); ++q) {
          if (per_consumer && (q == r_ || !consumer(q))) continue;
          std::memcpy(c_.stage(r_, i) + (per_consumer ? q * per_step * esize : 0),
                      bytes(call_.input) + (in_block(q) + begin) * esize, len * esize);
        }
        publish(c_, progress(r_).posted, flag(i));
      }
      if (consumer(r_)) {
        for (int p = 0; p < n_; ++p) {
          if (p == r_ || !producer(p)) continue;
          std::byte* to = bytes(call_.output) + (out_block(p) + begin) * esize;
          if (cma) {
            cma_read(p, to, c_.header(p, seq_).input_offset + (in_block(r_) + begin) * esize, len * esize);
            continue;
          }
          const std::byte* from;
          if (in_place) {
            from = bytes(peer_input(p)) + (in_block(r_) + begin) * esize;
          } else {
            wait_flag(c_, progress(p).posted, flag(i), "collective");
            from = c_.stage(p, i) + (per_consumer ? r_ * per_step * esize : 0);
          }
          copy_bytes(to, from, len * esize, stream);
        }
        publish(c_, progress(r_).consumed, flag(i));
      }
    }
    if (direct && i_produce && steps > 0) {
      for (int q = 0; q < n_; ++q) {
        if (q != r_ && consumer(q)) wait_consumed(q, steps - 1);
      }
    }
  }

  CommState& c_;
  const CollCall& call_;
  const int n_;
  const int r_;
  const std::size_t esize_;
  std::uint64_t seq_ = 0;
  std::uint64_t staged_ = 0;  ///< v-variants: the arena offset of this rank's staged counts and data
};

// ---- Point-to-point channels. ----

/// One direction between two ranks: a ring of kP2PDepth entries the sender fills and the
/// receiver empties, and the description of the message in flight.
struct P2PChannel {
  alignas(kCacheLine) std::atomic<std::uint64_t> sent{0};   ///< step_flag(message, step) staged
  alignas(kCacheLine) std::atomic<std::uint64_t> acked{0};  ///< step_flag(message, step) copied out
  alignas(kCacheLine) std::uint64_t count = 0;
  DType dtype = DType::u8;
  std::atomic<std::uint32_t> broken{0};  ///< a mismatch was seen: the channel is unusable
};
constexpr std::size_t kP2PChunk = 256 * 1024;
constexpr std::size_t kP2PDepth = 2;
constexpr std::size_t kP2PHeader = 4096;

P2PChannel& channel(CommState& comm, int from, int to) {
  const std::size_t index = static_cast<std::size_t>(from) * comm.size + to;
  if (comm.p2p_channels.empty()) comm.p2p_channels.assign(static_cast<std::size_t>(comm.size) * comm.size, nullptr);
  void*& slot = comm.p2p_channels[index];
  if (slot == nullptr) {
    std::string name = fmt::format("nodal.p2p:{}:{}-{}", comm.name, from, to);
    slot = comm.arena->find_or_create(name.c_str(), kP2PHeader + kP2PDepth * kP2PChunk, 4096,
                                      [](void* where) { new (where) P2PChannel(); });
  }
  return *static_cast<P2PChannel*>(slot);
}

std::byte* channel_entry(P2PChannel& ch, std::uint64_t step) {
  return reinterpret_cast<std::byte*>(&ch) + kP2PHeader + (step % kP2PDepth) * kP2PChunk;
}

void check_channel(const P2PChannel& ch, const CommState& comm, int from, int to) {
  if (ch.broken.load(std::memory_order_acquire) != 0) {
    throw UsageError(fmt::format("send/recv between ranks {} and {} of communicator '{}': count or dtype of the send "
                                 "and the recv differ (sent {} x {}); the pair's channel is unusable now",
                                 from, to, comm.name, ch.count, dtype_name(ch.dtype)));
  }
}

void check_peer(const CommState& comm, int peer, const char* what) {
  if (peer < 0 || peer >= comm.size || peer == comm.rank) {
    throw UsageError(fmt::format("{}: peer {} is not another rank of communicator '{}' (size {}, this rank {})", what,
                                 peer, comm.name, comm.size, comm.rank));
  }
}

}  // namespace

void run_collective(CommState& comm, const CollCall& call) { Call(comm, call).run(); }

void send_message(CommState& comm, const void* input, std::size_t count, DType dtype, int peer) {
  check_peer(comm, peer, "send");
  check_job_alive();
  P2PChannel& ch = channel(comm, comm.rank, peer);
  check_channel(ch, comm, comm.rank, peer);
  if (comm.p2p_sent.empty()) comm.p2p_sent.assign(static_cast<std::size_t>(comm.size), 0);
  const std::uint64_t message = ++comm.p2p_sent[peer];
  const std::size_t total = count * element_size(dtype);
  const std::size_t steps = std::max<std::size_t>(1, ceil_div(total, kP2PChunk));
  // The previous message is fully acknowledged (send is a rendezvous), so the header is free.
  ch.count = count;
  ch.dtype = dtype;
  for (std::size_t i = 0; i < steps; ++i) {
    if (i >= kP2PDepth) {
      wait_until(
          comm.shared->word,
          [&] { return ch.acked.load(std::memory_order_acquire) >= step_flag(message, i - kP2PDepth) || ch.broken.load(); },
          Deadline{}, "send");
      check_channel(ch, comm, comm.rank, peer);
    }
    const std::size_t begin = i * kP2PChunk;
    const std::size_t len = std::min(kP2PChunk, total - std::min(total, begin));
    if (len != 0) std::memcpy(channel_entry(ch, i), bytes(input) + begin, len);
    publish(comm, ch.sent, step_flag(message, i));
  }
  wait_until(
      comm.shared->word,
      [&] { return ch.acked.load(std::memory_order_acquire) >= step_flag(message, steps - 1) || ch.broken.load(); },
      Deadline{}, "send");
  check_channel(ch, comm, comm.rank, peer);
}

void recv_message(CommState& comm, void* output, std::size_t count, DType dtype, int peer) {
  check_peer(comm, peer, "recv");
  check_job_alive();
  P2PChannel& ch = channel(comm, peer, comm.rank);
  check_channel(ch, comm, peer, comm.rank);
  if (comm.p2p_received.empty()) comm.p2p_received.assign(static_cast<std::size_t>(comm.size), 0);
  const std::uint64_t message = ++comm.p2p_received[peer];
  wait_flag(comm, ch.sent, step_flag(message, 0), "recv");
  if (ch.count != count || ch.dtype != dtype) {
    std::uint64_t sent = ch.count;
    DType sent_dtype = ch.dtype;
    ch.broken.store(1, std::memory_order_release);
    notify(comm.shared->word);
    throw UsageError(fmt::format("recv of {} x {} from rank {} on communicator '{}' got a send of {} x {}; the pair's "
                                 "channel is unusable now",
                                 count, dtype_name(dtype), peer, comm.name, sent, dtype_name(sent_dtype)));
  }
  const std::size_t total = count * element_size(dtype);
  const std::size_t steps = std::max<std::size_t>(1, ceil_div(total, kP2PChunk));
  for (std::size_t i = 0; i < steps; ++i) {
    if (i > 0) wait_flag(comm, ch.sent, step_flag(message, i), "recv");
    const std::size_t begin = i * kP2PChunk;
    const std::size_t len = std::min(kP2PChunk, total - std::min(total, begin));
    if (len != 0) std::memcpy(bytes(output) + begin, channel_entry(ch, i), len);
    publish(comm, ch.acked, step_flag(message, i));
  }
}

}  // namespace nodal::detail
