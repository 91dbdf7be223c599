// The CUDA IPC collectives (gpu_backend.hpp): ranks that share a GPU (or sit on GPUs with peer
// access) reduce each other's CUDA buffers in place over the job's GPU pool, ordered by host flags in
// the job arena and interprocess CUDA events. NCCL refuses two ranks of one communicator on one GPU;
// several processes per GPU is common (data loaders, pipeline stages, tests), so nodal does it.
//
// Per communicator, in the arena ("nodal.comm-cudaipc:<name>"), a record per rank: four flags on
// their own cache lines (posted, reduced, done: the number of the call they describe, only
// growing; closed: set by the destructor, "Closing"), the rank's scratch block in its GPU pool
// (gpu::PoolBlock, remapped by peers when its generation changes), where its input of the current
// call lies when peers read it in place (a PoolBlock and the call's number), and the handles of
// its four interprocess events (posted and reduced, each double-buffered by call parity). In every
// rank's GPU pool, its scratch: [staging | reduced] (cuda/ipc_plan.hpp).
//
// Call k on rank r (every rank makes the same calls in the same order: the dispatcher checked it):
//  1. begin: wait (host) until every peer's done >= k-1. A rank publishes done = k-1 only after its
//     host saw its stream finish call k-1, so every peer's reads of r's scratch (and every peer's
//     stream wait on r's events) for earlier calls have completed on the GPU: r may now grow or
//     overwrite its scratch and its record's input block, and record its events again.
//  2. share or stage: in large calls (ipc_plan.hpp large_call), when r's input lies in r's own GPU
//     pool (gpu::find_pool_block: the backend gets device addresses, and asks the pool) and its
//     writes cannot meet the peers' reads (input_readable_in_place), r writes the block and k to its
//     record: peers read the input where it is ("Inputs read in place" below). Otherwise r copies
//     the input into its staging area on r's stream ("Streams": the backend's internal stream;
//     cudaMalloc memory, small calls). Then r
//     records the posted event and publishes posted = k (release: the record is written before).
//  3. for each peer: wait (host) for its posted >= k, then cudaStreamWaitEvent on its posted event:
//     r's stream now runs after the peer's staging copy.
//  4. one kernel reads every rank's input (its published block or staged copy, from each peer's
//     record for call k) for r's part of the output: the whole output for small calls (one pass)
//     or r's share for large ones, written to r's reduced area, then (reduced event, reduced flag,
//     stream waits as in 2-3) a batched copy of every peer's reduced share. Large broadcasts,
//     allgathers and reduce_scatters also record the reduced event after their reading kernels.
//  5. finish: the host waits for r's stream (polling an event, checking the job's abort word:
//     PeerFailure when a rank died), then publishes done = k.
// No kernel reads a flag: a kernel spinning on memory another process writes can hang when the
// processes' kernels time-slice one GPU (no MPS). Only hosts wait, and only on host flags.
//
// Streams. "r's stream" above is the backend's internal stream (cudaStreamNonBlocking, created on
// r's device), never the caller's: each call first records an event on the caller's stream and
// makes the internal stream wait for it (the call runs after the caller's queued work), then
// queues every copy, stream wait on a peer's event and kernel on the internal stream. No event
// leads back to the caller's stream: the host returns only after it saw the internal stream finish
// the call (step 5; barrier: the same wait), so whatever the caller queues afterwards runs after
// the result is in place.
//
// After a peer dies. A peer killed after publishing posted but before its GPU ran the recorded
// cudaEventRecord may leave a stream wait on its event pending for good. The host's wait turns
// that into PeerFailure (the abort word), and only the internal stream is stuck: the caller's
// stream (by default the legacy default stream, with which a non-blocking stream does not
// synchronize) stays usable. The backend is then dead: every later call throws PeerFailure at
// once, and the internal stream, its events and its scratch are never synchronized or freed again
// (leaked; the destructor touches nothing). Calls that synchronize the whole device
// (cudaDeviceSynchronize, and cudaFree, which may) can still hang on the stuck stream: a job that
// lost a rank should save what it needs and exit.
//
// Closing (the destructor). finish() says only that r's own stream is done; in a one-pass call
// (or a large call where r did not share its input) a peer may still be between wait_flag(posted)
// and its cudaStreamWaitEvent on r's event, or its kernel reading r's staging area may not have
// run yet ("last allreduce, then exit"). So the destructor waits (polling with short sleeps, at
// most 10 s, stopping when the job's abort word is set) until r's stream is idle and every peer's
// done >= the last call r posted (a call r never posted was never read by a peer). Then it closes
// its imports of the peers' events, publishes closed = 1 in its record, and frees its scratch (the
// pool may reuse the block at once), stream and local events. Its own interprocess events it
// destroys only when every peer has closed its imports too, or that peer's process is gone
// (kill(pid, 0): ESRCH): a peer's cudaEventDestroy of its import after the export was destroyed
// would be an operation on the import after the exported event was freed, undefined by
// cudaIpcOpenEventHandle's contract; otherwise those four handles are leaked. When the wait does
// not complete (timeout, job failed, CUDA error) or the backend is dead, nothing is freed: events,
// stream and scratch are leaked on purpose (the scratch's Storage is kept in a never-destroyed
// list), since a peer may still use them.
//
// Devices. Every entry point (constructor, calls, destructor) makes the backend's device current
// and gives the calling thread its previous context back afterwards (gpu::DeviceGuard, gpu.hpp:
// cuCtxGetCurrent / cuCtxSetCurrent). A thread that had no current context
// gets none made for it: cudaGetDevice says 0 then, and cudaSetDevice(0) would create a context
// on GPU 0; such a thread keeps the backend's device current.
//
// Ranks on several GPUs. At construction every rank's GPU UUID is gathered (on the shared-memory
// path; device indices are per process). When the ranks do not all share one GPU, each rank
// checks that every other rank's GPU is visible to its process and peer-accessible from its own
// GPU (cudaDeviceCanAccessPeer); the verdicts are gathered too, and when any pair fails every rank
// throws the same CudaError naming it. Access itself is granted when a peer's pool chunk is mapped
// (gpu::map_pool_block sets access for this process's devices).
//
// Events and parity. A rank records its event (kind, k & 1) in call k and publishes the flag after
// cudaEventRecord returned; a peer calls cudaStreamWaitEvent only after seeing the flag, so it
// waits on that record (stream waits bind to the event's latest record when they are issued). The
// owner records the same event again in call k+2 at the earliest, after step 1 of call k+1 saw
// every peer's done >= k, i.e. after every peer's wait on the call-k record has completed. Parity
// adds a margin: the waits of consecutive calls are never on the same event at all.
//
// Inputs read in place. Staging costs a copy of every input (2B of HBM traffic per rank: the
// 64 MiB allreduce would stay near 58% of the HBM bound); large calls skip it for pool inputs.
// Where and only where peers read r's input in place, two things must hold:
//  (a) nothing writes the bytes peers read while they read them. Only r writes r's memory (other
//      ranks write their own outputs and scratch; a user who passes one pool block as r's input
//      and as a peer's output races on any path). r's writes during the call, per op:
//      - allreduce, reduce (root), large: peer p reads share p of r's input. r's reduce kernel
//        writes r's own share of the output while peers read; the other shares are written by the
//        gather, after r's stream waited for every peer's reduced event, i.e. after every peer's
//        reduce kernel. In place (input == output) r's output share is r's input share, which no
//        peer reads (and r's kernel reads and writes each element in one thread); disjoint buffers
//        are trivially fine; a partial overlap could put r's output share on a share a peer
//        reads: staged.
//      - reduce, non-root: writes no output.
//      - reduce_scatter: peer p reads block p of r's input; r writes its output, which in place
//        (output == input + r * count) is block r, read by no peer; partial overlap: staged.
//      - allgather: peers read all of r's input; r writes the other ranks' blocks of its output,
//        and in place (input == output + r * count) its input is its own block, which it skips.
//        Partial overlap: staged.
//      - broadcast: only the root's buffer is read, and the root does not write it.
//  (b) r returns only after every peer finished reading (then its user may overwrite or free the
//      buffer, or queue work that does; step 1 of r's next call would come too late). r returns
//      after its host saw its stream finish (step 5), so it suffices that r's stream waited for an
//      event every peer records after its reads: the reduced events.
//      allreduce and the root of reduce already wait for them before gathering; a non-root of
//      reduce, and every rank of a large broadcast, allgather, reduce_scatter that shared its
//      input, waits for every peer's reduced event at the end of the call. Every rank records
//      its reduced event in every large call (large_call depends on kind, count, dtype and n
//      only, so all ranks agree), whether or not its own input was shared.
// Small (one-pass) calls always stage: they are latency-bound, and (b) would add a round to each
// (for one-pass allreduce and reduce no event follows the peers' reads at all). Sharing is per rank
// and per call (a rank's input may be cudaMalloc memory while a peer's is pooled): a reader takes
// each peer's source from that peer's record, where input_call == k says "read my block", else
// "read my staging area". Peers map the block with gpu::map_pool_block (record 0: no reference
// counts, r keeps the memory alive by (b); chunk imports are cached, ~0.2 ms the first time).
// The scratch layout keeps its staging area either way (every rank computes every peer's layout
// from the call alone, so the layout cannot depend on a rank's choice).
#include "comm_state.hpp"
#include "gpu_backend.hpp"
#include "gpu_path.hpp"
#include "shm/algorithms.hpp"
#include "cuda/ipc_plan.hpp"
#include "cuda/reduce_kernels.hpp"
#include "reduce_kernels.hpp"

#include <nodal/errors.hpp>
#include <nodal/detail/gpu.hpp>
#include <nodal/detail/storage.hpp>
#include <nodal/detail/wait.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <sched.h>
#include <signal.h>
#include <thread>
#include <utility>
#include <unistd.h>
#include <vector>

#include <fmt/format.h>

namespace nodal::detail {
namespace {

using namespace cuda_ipc;

constexpr std::uint64_t kIpcMagic = 0x6370692d6c646e31ULL;  // "1ndl-ipc"

/// A rank's part of the communicator's arena record.
struct alignas(kCacheLine) RankRecord {
  alignas(kCacheLine) std::atomic<std::uint64_t> posted{0};   ///< my input of call k is (being) staged or published
  alignas(kCacheLine) std::atomic<std::uint64_t> reduced{0};  ///< my reduced share of call k is (being) written
  alignas(kCacheLine) std::atomic<std::uint64_t> done{0};     ///< call k finished on my GPU stream
  /// 1 once my backend closed its imports of the peers' events (destructor, "Closing").
  alignas(kCacheLine) std::atomic<std::uint64_t> closed{0};
  /// Written by the owner before it publishes posted for the call that first uses them; read by
  /// peers after they saw that flag (acquire).
  alignas(kCacheLine) gpu::PoolBlock scratch{};
  std::uint64_t scratch_generation = 0;  ///< 0: no scratch yet
  std::int32_t device = 0;
  std::int32_t pid = 0;
  /// Call input_call's input, where it lies in the rank's own GPU pool, for peers to read in place
  /// (its staging area holds no copy then). Written by the owner before it publishes posted for
  /// that call; a peer reads it after seeing posted >= k, and uses it only if input_call == k.
  gpu::PoolBlock input{};
  std::uint64_t input_call = 0;
  /// cudaIpcEventHandle_t of each event slot (event_slot()); written when the backend opens,
  /// before the rank's first flag.
  alignas(kCacheLine) std::array<std::array<char, 64>, kEventsPerRank> events{};
};

struct IpcShared {
  std::uint64_t magic;
  std::int32_t world_size;
};
constexpr std::size_t kHeaderBytes = 64;
static_assert(sizeof(IpcShared) <= kHeaderBytes);

[[noreturn]] void throw_cuda(const char* what, cudaError_t error, int rank) {
  throw CudaError(fmt::format("CUDA IPC collectives, rank {}: {} failed: {} ({})", rank, what, cudaGetErrorName(error),
                              cudaGetErrorString(error)));
}

/// Keeps `storage` alive until the process ends, on purpose (the destructor's leak path: a peer
/// may still read the memory, and the pool would reuse the block at once). Never destroyed, so
/// safe at exit too.
void keep_forever(std::shared_ptr<Storage> storage) noexcept {
  if (storage == nullptr) return;
  static auto* mutex = new std::mutex;
  static auto* kept = new std::vector<std::shared_ptr<Storage>>;
  try {
    const std::lock_guard<std::mutex> lock(*mutex);
    kept->push_back(std::move(storage));
  } catch (...) {
    new std::shared_ptr<Storage>(std::move(storage));  // NOLINT: leaked on purpose
  }
}

/// How long the destructor waits for the peers to finish with this rank's events and scratch.
constexpr auto kCloseWait = std::chrono::seconds(10);

class CudaIpcBackend final : public GpuBackend {
 public:
  CudaIpcBackend(CommState& comm, int device) : comm_(comm), device_(device), n_(comm.size), me_(comm.rank) {
    if (n_ > kMaxRanks) {
      throw UsageError(fmt::format("the CUDA IPC collectives support up to {} ranks in a communicator; {} has {}",
                                   kMaxRanks, comm.name, n_));
    }
    gpu::require_available("CUDA IPC collectives");
    gpu::require_shareable_device(device_, n_);
    const gpu::DeviceGuard guard(device_);  // the caller's context comes back, if it had one
    check_peer_access();
    const std::size_t total = kHeaderBytes + static_cast<std::size_t>(n_) * sizeof(RankRecord);
    const std::string object = "nodal.comm-cudaipc:" + comm.name;
    auto* base =
        static_cast<std::byte*>(comm.arena->find_or_create(object.c_str(), total, kCacheLine, [&](void* where) {
          std::memset(where, 0, total);
          auto* shared = new (where) IpcShared{};
          shared->magic = kIpcMagic;
          shared->world_size = n_;
          auto* records = reinterpret_cast<RankRecord*>(static_cast<std::byte*>(where) + kHeaderBytes);
          for (int r = 0; r < n_; ++r) new (&records[r]) RankRecord();
        }));
    auto* shared = reinterpret_cast<IpcShared*>(base);
    if (shared->magic != kIpcMagic || shared->world_size != n_) {
      throw UsageError(fmt::format("communicator {}: its CUDA IPC record does not match its size", comm.name));
    }
    records_ = reinterpret_cast<RankRecord*>(base + kHeaderBytes);
    RankRecord& mine = records_[me_];
    mine.device = device_;
    mine.pid = static_cast<std::int32_t>(::getpid());
    try {
      for (int slot = 0; slot < kEventsPerRank; ++slot) {
        check(cudaEventCreateWithFlags(&events_[slot], cudaEventDisableTiming | cudaEventInterprocess),
              "cudaEventCreateWithFlags(interprocess)");
        cudaIpcEventHandle_t handle;
        check(cudaIpcGetEventHandle(&handle, events_[slot]), "cudaIpcGetEventHandle");
        static_assert(sizeof(handle) == 64);
        std::memcpy(mine.events[slot].data(), &handle, sizeof handle);
      }
      check(cudaEventCreateWithFlags(&finished_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
      check(cudaEventCreateWithFlags(&entered_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
      check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags(non-blocking)");
    } catch (...) {
      // No peer has seen a flag of this rank: nothing of it is in use elsewhere.
      for (cudaEvent_t event : events_)
        if (event != nullptr) (void)cudaEventDestroy(event);
      if (finished_ != nullptr) (void)cudaEventDestroy(finished_);
      if (entered_ != nullptr) (void)cudaEventDestroy(entered_);
      throw;
    }
    peer_events_.resize(static_cast<std::size_t>(n_));
    for (auto& slots : peer_events_) slots.fill(nullptr);
    peer_scratch_.resize(static_cast<std::size_t>(n_));
  }

  /// Frees this rank's events, stream and scratch only once no peer can use them any more
  /// ("Closing" in the header comment); leaks them on purpose otherwise.
  ~CudaIpcBackend() override { close(); }

  const char* name() const noexcept override { return "cuda_ipc"; }

  void close() noexcept override {
    if (closed_) return;
    closed_ = true;
    bool released = false;
    if (!dead_) {  // dead: stream_ may wait for good; touch nothing
      try {
        const gpu::DeviceGuard guard(device_);  // the caller's context comes back, if it had one
        released = close_down();
      } catch (...) {
        released = false;
      }
    }
    // Not released: the events (ours and the imported ones), the stream and the scratch stay
    // allocated until the process ends, on purpose: a peer may still use them.
    if (!released) keep_forever(std::move(scratch_storage_));
  }

  void allreduce(const void* input, void* output, std::size_t count, DType dtype, ReduceOp op,
                 cuda::Stream user) override {
    run_call(user, [&](cuda::Stream stream) {
      const std::size_t es = element_size(dtype);
      const Algorithm algorithm = choose_algorithm(count * es, n_, one_pass_max_bytes());
      const ScratchLayout layout = scratch_layout(Kind::allreduce, algorithm, count, es, n_);
      begin(layout);
      // Large calls: peers read a pool input in place; this rank's stream waits for their reduced
      // events (below, before gathering) and so returns after they finished reading it.
      (void)share_input(input, count * es, may_share(Kind::allreduce, input, output, count, es, false), stream);
      post(stream);
      wait_peers(EventKind::posted, stream);
      std::array<const void*, kMaxRanks> srcs{};
      sources(srcs, input, 0);
      if (algorithm == Algorithm::one_pass) {
        launch_reduce(dtype, op, srcs.data(), n_, output, nullptr, count, stream);
      } else {
        const Range share = share_range(count, es, n_, me_);
        offset_sources(srcs, share.begin * es);
        launch_reduce(dtype, op, srcs.data(), n_, static_cast<std::byte*>(output) + share.begin * es,
                      scratch_ + layout.reduced_offset, share.size(), stream);
        post_reduced(stream);
        wait_peers(EventKind::reduced, stream);
        gather_shares(output, count, es, layout, stream);
      }
      finish(stream);
    });
  }

  void reduce(const void* input, void* output, std::size_t count, DType dtype, ReduceOp op, int root,
              cuda::Stream user) override {
    run_call(user, [&](cuda::Stream stream) {
      const std::size_t es = element_size(dtype);
      const Algorithm algorithm = choose_algorithm(count * es, n_, one_pass_max_bytes());
      const ScratchLayout layout = scratch_layout(Kind::reduce, algorithm, count, es, n_);
      begin(layout);
      if (algorithm == Algorithm::one_pass) {
        // Only the root reads: it takes its own input in place and every peer's staged one.
        if (me_ != root) stage(input, count * es, stream);
        post(stream);
        if (me_ == root) {
          wait_peers(EventKind::posted, stream);
          std::array<const void*, kMaxRanks> srcs{};
          sources(srcs, input, 0);
          launch_reduce(dtype, op, srcs.data(), n_, output, nullptr, count, stream);
        }
      } else {
        const bool shared =
            share_input(input, count * es, may_share(Kind::reduce, input, output, count, es, me_ == root), stream);
        post(stream);
        wait_peers(EventKind::posted, stream);
        std::array<const void*, kMaxRanks> srcs{};
        sources(srcs, input, 0);
        const Range share = share_range(count, es, n_, me_);
        offset_sources(srcs, share.begin * es);
        void* out = me_ == root ? static_cast<void*>(static_cast<std::byte*>(output) + share.begin * es)
                                : static_cast<void*>(scratch_ + layout.reduced_offset);
        launch_reduce(dtype, op, srcs.data(), n_, out, nullptr, share.size(), stream);
        post_reduced(stream);
        if (me_ == root) {
          wait_peers(EventKind::reduced, stream);
          gather_shares(output, count, es, layout, stream);
        } else if (shared) {
          wait_peers(EventKind::reduced, stream);  // peers read this rank's input until their reduced event
        }
      }
      finish(stream);
    });
  }

  void broadcast(void* buffer, std::size_t count, DType dtype, int root, cuda::Stream user) override {
    run_call(user, [&](cuda::Stream stream) {
      const std::size_t es = element_size(dtype);
      const std::size_t bytes = count * es;
      const bool large = large_call(Kind::broadcast, count, es, n_, one_pass_max_bytes());
      begin(scratch_layout(Kind::broadcast, Algorithm::one_pass, count, es, n_));
      // The root's buffer: shared in place (large calls, pool memory) or staged; non-roots read it.
      const bool shared =
          me_ == root &&
          share_input(buffer, bytes, may_share(Kind::broadcast, buffer, buffer, count, es, true), stream);
      post(stream);
      if (me_ != root) {
        wait_peer(root, EventKind::posted, stream);
        const CopySegment segment{peer_input(root), buffer, bytes};
        launch_copies(&segment, 1, stream);
      }
      end_reading(large, shared, stream);
      finish(stream);
    });
  }

  void allgather(const void* input, void* output, std::size_t count, DType dtype, cuda::Stream user) override {
    run_call(user, [&](cuda::Stream stream) {
      const std::size_t es = element_size(dtype);
      const std::size_t bytes = count * es;
      const bool large = large_call(Kind::allgather, count, es, n_, one_pass_max_bytes());
      begin(scratch_layout(Kind::allgather, Algorithm::one_pass, count, es, n_));
      const bool shared =
          share_input(input, bytes, may_share(Kind::allgather, input, output, count, es, false), stream);
      post(stream);
      wait_peers(EventKind::posted, stream);
      std::array<CopySegment, kMaxRanks> segments{};
      auto* out = static_cast<std::byte*>(output);
      for (int p = 0; p < n_; ++p) {
        std::byte* dst = out + static_cast<std::size_t>(p) * bytes;
        const void* src = p == me_ ? input : peer_input(p);
        // In place (input == output + rank * count) the own block is already there (launch_copies
        // skips src == dst); any other overlap reads the staged copy instead (such an input is
        // never shared: input_readable_in_place).
        if (p == me_ && src != dst && overlaps(src, bytes, out, static_cast<std::size_t>(n_) * bytes)) src = scratch_;
        segments[static_cast<std::size_t>(p)] = {src, dst, bytes};
      }
      launch_copies(segments.data(), n_, stream);
      end_reading(large, shared, stream);
      finish(stream);
    });
  }

  void reduce_scatter(const void* input, void* output, std::size_t count, DType dtype, ReduceOp op,
                      cuda::Stream user) override {
    run_call(user, [&](cuda::Stream stream) {
      const std::size_t es = element_size(dtype);
      const bool large = large_call(Kind::reduce_scatter, count, es, n_, one_pass_max_bytes());
      begin(scratch_layout(Kind::reduce_scatter, Algorithm::one_pass, count, es, n_));
      const bool shared = share_input(input, static_cast<std::size_t>(n_) * count * es,
                                      may_share(Kind::reduce_scatter, input, output, count, es, false), stream);
      post(stream);
      wait_peers(EventKind::posted, stream);
      // A staged input: every contribution from the staged copies, this rank's too (the staged
      // path makes no assumption on how input and output overlap). A shared input is disjoint from
      // the output or in place (output == input + rank * count: each element read, then written by
      // the same thread), so the kernel reads this rank's block where it is.
      std::array<const void*, kMaxRanks> srcs{};
      for (int p = 0; p < n_; ++p) {
        srcs[static_cast<std::size_t>(p)] =
            p != me_ ? static_cast<const void*>(peer_input(p)) : (shared ? input : scratch_);
      }
      offset_sources(srcs, static_cast<std::size_t>(me_) * count * es);
      launch_reduce(dtype, op, srcs.data(), n_, output, nullptr, count, stream);
      end_reading(large, shared, stream);
      finish(stream);
    });
  }

  void barrier(cuda::Stream user) override {
    run_call(user, [&](cuda::Stream stream) {
      begin(scratch_layout(Kind::barrier, Algorithm::one_pass, 0, 1, n_));
      wait_stream(stream);  // this rank's queued work is done
      publish(comm_, records_[me_].posted, call_);
      for (int p = 0; p < n_; ++p)
        if (p != me_) wait_flag(comm_, records_[p].posted, call_, "CUDA IPC barrier");
      publish(comm_, records_[me_].done, call_);
    });
  }

  void gather(const void*, void*, std::size_t, DType, int, cuda::Stream) override { unsupported("gather"); }
  void scatter(const void*, void*, std::size_t, DType, int, cuda::Stream) override { unsupported("scatter"); }
  void alltoall(const void*, void*, std::size_t, DType, cuda::Stream) override { unsupported("alltoall"); }
  void send(const void*, std::size_t, DType, int, cuda::Stream) override { unsupported("send"); }
  void recv(void*, std::size_t, DType, int, cuda::Stream) override { unsupported("recv"); }

 private:
  /// One call: marks nothing and throws PeerFailure at once when an earlier call met a dead peer
  /// (the internal stream may wait for good: "After a peer dies"); otherwise makes the backend's
  /// device current (DeviceGuard), orders the internal stream after the work queued on the
  /// caller's stream so far (an event recorded there, waited for by the internal stream), and
  /// runs `body` on the internal stream. No event leads back to the caller's stream: the host
  /// returns only after it saw the internal stream finish the call (finish, barrier), so work
  /// the caller queues afterwards runs after the result is in place.
  template <class Body>
  void run_call(cuda::Stream user, Body&& body) {
    if (dead_) {
      check_job_alive();  // the job's own message, when the abort word says why
      throw PeerFailure(
          fmt::format("CUDA IPC collectives, rank {}: communicator {} cannot be used any more (an "
                      "earlier call failed because a peer failed)",
                      me_, comm_.name));
    }
    const gpu::DeviceGuard guard(device_);  // the caller's context comes back, if it had one
    try {
      check(cudaEventRecord(entered_, user), "cudaEventRecord(the caller's stream)");
      check(cudaStreamWaitEvent(stream_, entered_, 0), "cudaStreamWaitEvent(the caller's stream)");
      body(stream_);
    } catch (const PeerFailure&) {
      dead_ = true;  // never synchronize or destroy stream_ again: it may wait on a dead peer's event
      throw;
    }
  }

  /// At construction (collective): refuses, with the same CudaError on every rank, a communicator
  /// where some rank cannot access another rank's GPU ("Ranks on several GPUs"). Two allgathers on
  /// the shared-memory path (every rank's GPU UUID, then every rank's verdict); the second is
  /// skipped on every rank when all ranks share one GPU. A failed CUDA query is a verdict, not an
  /// exception, so that no rank leaves the other ranks waiting in the second allgather.
  void check_peer_access() {
    const GpuUuid mine = gpu_uuid(device_);
    std::vector<GpuUuid> all(static_cast<std::size_t>(n_));
    run_collective(comm_,
                   CollCall{CollKind::allgather, mine.data(), all.data(), mine.size(), DType::u8, ReduceOp::sum, -1});
    if (std::all_of(all.begin(), all.end(), [&](const GpuUuid& uuid) { return uuid == all[0]; })) return;
    enum Reason : std::int32_t { ok = 0, not_visible = 1, no_peer_access = 2, query_failed = 3 };
    std::array<std::int32_t, 2> verdict{-1, ok};  // the first peer this rank cannot access, and why
    try {
      int count = 0;
      check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
      std::vector<GpuUuid> local(static_cast<std::size_t>(count));
      for (int d = 0; d < count; ++d) local[static_cast<std::size_t>(d)] = gpu_uuid(d);
      for (int p = 0; p < n_ && verdict[0] < 0; ++p) {
        const GpuUuid& theirs = all[static_cast<std::size_t>(p)];
        if (theirs == mine) continue;
        const auto found = std::find(local.begin(), local.end(), theirs);
        if (found == local.end()) {
          verdict = {p, not_visible};  // not in this process's CUDA_VISIBLE_DEVICES
          continue;
        }
        int can = 0;
        check(cudaDeviceCanAccessPeer(&can, device_, static_cast<int>(found - local.begin())),
              "cudaDeviceCanAccessPeer");
        if (can == 0) verdict = {p, no_peer_access};
      }
    } catch (const std::exception&) {
      verdict = {me_, query_failed};
    }
    std::vector<std::int32_t> verdicts(static_cast<std::size_t>(n_) * 2);
    run_collective(comm_, CollCall{CollKind::allgather, verdict.data(), verdicts.data(), verdict.size(), DType::i32,
                                   ReduceOp::sum, -1});
    for (int r = 0; r < n_; ++r) {
      const std::int32_t peer = verdicts[static_cast<std::size_t>(r) * 2];
      const std::int32_t reason = verdicts[static_cast<std::size_t>(r) * 2 + 1];
      if (peer < 0) continue;
      const char* why = reason == not_visible      ? "is not visible to its process (CUDA_VISIBLE_DEVICES)"
                        : reason == no_peer_access ? "is not peer-accessible from its GPU (cudaDeviceCanAccessPeer)"
                                                   : "could not be checked (a CUDA query failed on that rank)";
      throw CudaError(fmt::format(
          "CUDA IPC collectives, communicator {}: rank {} cannot read rank {}'s GPU memory: that GPU {}. Ranks of "
          "one communicator on different GPUs need peer access between every pair of their GPUs (NVLink or PCIe "
          "P2P); put them on one GPU, or give every rank its own GPU (NCCL)",
          comm_.name, r, peer, why));
    }
  }

  /// The destructor's work ("Closing" in the header comment): waits, polling, within kCloseWait and
  /// while the job is alive, until this rank's stream is idle and every peer's done has reached the
  /// last call this rank posted (then no peer's stream still waits on this rank's events or reads
  /// its scratch, and none will). Then closes the imported events, frees the scratch, the stream
  /// and the local events, and publishes closed; its own interprocess events only when every peer
  /// has closed its imports too (or its process is gone), and leaks them otherwise. Returns false,
  /// having freed nothing, when the wait did not complete: the caller leaks everything.
  bool close_down() noexcept {
    const std::uint64_t last = records_[me_].posted.load(std::memory_order_relaxed);
    const auto deadline = std::chrono::steady_clock::now() + kCloseWait;
    try {
      for (;;) {
        const cudaError_t state = cudaStreamQuery(stream_);
        if (state != cudaSuccess && state != cudaErrorNotReady) return false;
        bool quiet = state == cudaSuccess;
        for (int p = 0; p < n_ && quiet; ++p)
          if (p != me_ && records_[p].done.load(std::memory_order_acquire) < last) quiet = false;
        if (quiet) break;
        check_job_alive();
        if (std::chrono::steady_clock::now() >= deadline) return false;
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    } catch (...) {
      return false;  // PeerFailure: the job failed; a peer may never get there
    }
    for (auto& slots : peer_events_)
      for (cudaEvent_t& event : slots)
        if (event != nullptr) (void)cudaEventDestroy(std::exchange(event, nullptr));
    publish(comm_, records_[me_].closed, 1);
    scratch_storage_.reset();
    (void)cudaEventDestroy(finished_);
    (void)cudaEventDestroy(entered_);
    (void)cudaStreamDestroy(stream_);
    bool imports_closed = true;
    for (int p = 0; p < n_ && imports_closed; ++p) {
      if (p == me_ || records_[p].closed.load(std::memory_order_acquire) != 0) continue;
      const pid_t pid = records_[p].pid;
      if (pid <= 0 || ::kill(pid, 0) == 0 || errno != ESRCH) imports_closed = false;
    }
    // A peer destroying its import of an event after the owner destroyed the event is an operation on
    // the import after the export was freed (undefined, cudaIpcOpenEventHandle): leak the four
    // handles then.
    if (imports_closed)
      for (cudaEvent_t event : events_) (void)cudaEventDestroy(event);
    return true;
  }

  [[noreturn]] void unsupported(const char* what) const {
    throw UsageError(fmt::format(
        "{} on cuda tensors: the CUDA IPC collectives (ranks sharing a GPU) support allreduce, reduce, broadcast, "
        "allgather, reduce_scatter, barrier; for {} copy the tensors to the CPU (or give every rank its own GPU, "
        "where NCCL does it) (communicator {}, rank {})",
        what, what, comm_.name, me_));
  }

  void check(cudaError_t error, const char* what) const {
    if (error != cudaSuccess) throw_cuda(what, error, me_);
  }

  /// Step 1 of a call: waits until no peer still uses this rank's scratch or events, then grows
  /// the scratch if the call needs more (every rank grows at the same call: same counts).
  void begin(const ScratchLayout& layout) {
    ++call_;
    for (int p = 0; p < n_; ++p)
      if (p != me_) wait_flag(comm_, records_[p].done, call_ - 1, "CUDA IPC collective (peers finishing the last call)");
    const std::size_t capacity = grow_scratch(capacity_, layout.total());
    if (layout.total() > 0 && (capacity != capacity_ || scratch_storage_ == nullptr)) {
      scratch_storage_.reset();  // no peer reads it any more (above); its pool block can be reused
      scratch_storage_ = gpu::pool_allocate(device_, capacity);
      scratch_ = scratch_storage_->data();
      capacity_ = capacity;
      RankRecord& mine = records_[me_];
      mine.scratch = gpu::pool_block(*scratch_storage_);
      mine.scratch_generation = ++generation_;  // published with the next posted flag (release)
    }
  }

  /// Whether this rank may let peers read its input in place in this call (large_call and
  /// input_readable_in_place, ipc_plan.hpp); it still needs the input to lie in its pool.
  bool may_share(Kind kind, const void* input, const void* output, std::size_t count, std::size_t es, bool root) const {
    return large_call(kind, count, es, n_, one_pass_max_bytes()) &&
           input_readable_in_place(kind, input_overlap(kind, input, output, count, es, n_, me_), root);
  }

  /// Step 2: when `allowed` and [input, input + bytes) lies in this rank's own GPU pool on its
  /// device, publishes that block in this rank's record for this call (peers see it with the
  /// posted flag: release) and returns true; stages a copy otherwise and returns false.
  bool share_input(const void* input, std::size_t bytes, bool allowed, cuda::Stream stream) {
    if (allowed) {
      const std::optional<gpu::PoolBlock> block = gpu::find_pool_block(input, bytes);
      if (block && block->device == device_) {  // peers map it as they map the scratch (same device)
        RankRecord& mine = records_[me_];
        mine.input = *block;
        mine.input_call = call_;
        return true;
      }
    }
    stage(input, bytes, stream);
    return false;
  }

  /// The end of a call whose kernels read peers' inputs (broadcast, allgather, reduce_scatter):
  /// in large calls every rank records its reduced event after those reads; a rank whose input
  /// peers read in place makes its stream wait for all of them, so that it returns (and its
  /// user may overwrite the buffer) only after every peer finished reading it.
  void end_reading(bool large, bool shared, cuda::Stream stream) {
    if (large) post_reduced(stream);
    if (shared) wait_peers(EventKind::reduced, stream);
  }

  void stage(const void* input, std::size_t bytes, cuda::Stream stream) {
    if (bytes == 0) return;
    const CopySegment segment{input, scratch_, bytes};
    launch_copies(&segment, 1, stream);
  }

  void post(cuda::Stream stream) {
    check(cudaEventRecord(events_[event_slot(EventKind::posted, call_)], stream), "cudaEventRecord");
    publish(comm_, records_[me_].posted, call_);
  }
  void post_reduced(cuda::Stream stream) {
    check(cudaEventRecord(events_[event_slot(EventKind::reduced, call_)], stream), "cudaEventRecord");
    publish(comm_, records_[me_].reduced, call_);
  }

  void wait_peer(int p, EventKind kind, cuda::Stream stream) {
    const RankRecord& peer = records_[p];
    wait_flag(comm_, kind == EventKind::posted ? peer.posted : peer.reduced, call_,
              kind == EventKind::posted ? "CUDA IPC collective (peers' inputs)" : "CUDA IPC collective (peers' shares)");
    check(cudaStreamWaitEvent(stream, peer_event(p, event_slot(kind, call_)), 0), "cudaStreamWaitEvent(peer's event)");
  }
  void wait_peers(EventKind kind, cuda::Stream stream) {
    for (int p = 0; p < n_; ++p)
      if (p != me_) wait_peer(p, kind, stream);
  }

  cudaEvent_t peer_event(int p, int slot) {
    cudaEvent_t& event = peer_events_[static_cast<std::size_t>(p)][static_cast<std::size_t>(slot)];
    if (event == nullptr) {  // opened once (~240 us each), on first use
      cudaIpcEventHandle_t handle;
      std::memcpy(&handle, records_[p].events[static_cast<std::size_t>(slot)].data(), sizeof handle);
      check(cudaIpcOpenEventHandle(&event, handle), "cudaIpcOpenEventHandle");
    }
    return event;
  }

  /// Peer p's scratch in this process (call after seeing p's posted flag for the call).
  std::byte* peer_scratch(int p) {
    auto& [generation, address] = peer_scratch_[static_cast<std::size_t>(p)];
    const RankRecord& peer = records_[p];
    if (peer.scratch_generation == 0) return nullptr;  // the peer has needed no scratch yet (empty calls)
    if (generation != peer.scratch_generation) {
      address = static_cast<std::byte*>(gpu::map_pool_block(peer.scratch));
      generation = peer.scratch_generation;
    }
    return address;
  }

  /// Peer p's input of this call (call after seeing p's posted flag for it): the block of p's pool
  /// p published for this call, else p's staged copy. map_pool_block caches chunk imports.
  const std::byte* peer_input(int p) {
    const RankRecord& peer = records_[p];
    if (peer.input_call == call_) return static_cast<const std::byte*>(gpu::map_pool_block(peer.input));
    return peer_scratch(p);
  }

  /// Every rank's contribution: this rank's own input where it is, the peers' inputs (peer_input).
  void sources(std::array<const void*, kMaxRanks>& srcs, const void* input, std::size_t offset) {
    for (int p = 0; p < n_; ++p) srcs[static_cast<std::size_t>(p)] = p == me_ ? input : peer_input(p);
    offset_sources(srcs, offset);
  }
  void offset_sources(std::array<const void*, kMaxRanks>& srcs, std::size_t offset) const {
    for (int p = 0; p < n_; ++p) srcs[static_cast<std::size_t>(p)] = static_cast<const std::byte*>(srcs[static_cast<std::size_t>(p)]) + offset;
  }

  /// The all-gather half: every peer's reduced share into its place in `output`.
  void gather_shares(void* output, std::size_t count, std::size_t es, const ScratchLayout& layout, cuda::Stream stream) {
    std::array<CopySegment, kMaxRanks> segments{};
    int used = 0;
    for (int p = 0; p < n_; ++p) {
      if (p == me_) continue;  // the kernel wrote this rank's share to its output directly
      const Range share = share_range(count, es, n_, p);
      segments[static_cast<std::size_t>(used++)] = {peer_scratch(p) + layout.reduced_offset,
                                                    static_cast<std::byte*>(output) + share.begin * es, share.size() * es};
    }
    launch_copies(segments.data(), used, stream);
  }

  /// Step 5: waits for this rank's stream, then tells the peers.
  void finish(cuda::Stream stream) {
    wait_stream(stream);
    publish(comm_, records_[me_].done, call_);
  }

  /// Waits until the work queued on `stream` so far has finished, watching the job's abort word
  /// (a dead peer's event may never complete: PeerFailure, not a hang). Polls: spin for a while
  /// (kernels of a few microseconds), then sleep in short steps.
  void wait_stream(cuda::Stream stream) {
    check(cudaEventRecord(finished_, stream), "cudaEventRecord");
    const auto start = std::chrono::steady_clock::now();
    for (std::uint32_t round = 0;; ++round) {
      const cudaError_t state = cudaEventQuery(finished_);
      if (state == cudaSuccess) return;
      if (state != cudaErrorNotReady) throw_cuda("waiting for the collective's GPU work", state, me_);
      check_job_alive();
      if (round < 64) continue;
      if (std::chrono::steady_clock::now() - start < std::chrono::microseconds(200) && !oversubscribed()) continue;
      if (oversubscribed()) {
        ::sched_yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    }
  }

  CommState& comm_;
  int device_;
  int n_;
  int me_;
  RankRecord* records_ = nullptr;
  std::uint64_t call_ = 0;
  std::array<cudaEvent_t, kEventsPerRank> events_{};
  cudaEvent_t finished_ = nullptr;
  cudaEvent_t entered_ = nullptr;  ///< recorded on the caller's stream at the start of a call
  cudaStream_t stream_ = nullptr;  ///< the internal stream (non-blocking): every call's work
  bool dead_ = false;              ///< a call met PeerFailure: stream_ may wait for good
  bool closed_ = false;            ///< close() ran (nodal::finalize or the destructor)
  std::vector<std::array<cudaEvent_t, kEventsPerRank>> peer_events_;
  std::vector<std::pair<std::uint64_t, std::byte*>> peer_scratch_;  ///< per peer: (generation, address)
  std::shared_ptr<Storage> scratch_storage_;
  std::byte* scratch_ = nullptr;
  std::size_t capacity_ = 0;
  std::uint64_t generation_ = 0;
};

}  // namespace

std::unique_ptr<GpuBackend> make_cuda_ipc_backend(CommState& comm, int device) {
  return std::make_unique<CudaIpcBackend>(comm, device);
}

}  // namespace nodal::detail
