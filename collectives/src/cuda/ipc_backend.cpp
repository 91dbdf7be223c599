// The CUDA IPC collectives (gpu_backend.hpp): ranks that share a GPU (or sit on GPUs with peer
// access) reduce each other's CUDA buffers in place over the job's GPU pool, ordered by host flags in
// the job arena and interprocess CUDA events. NCCL refuses two ranks of one communicator on one GPU;
// several processes per GPU is common (data loaders, pipeline stages, tests), so nodal does it.
//
// Per communicator, in the arena ("nodal.comm-cudaipc:<name>"), a record per rank: three flags on
// their own cache lines (posted, reduced, done: the number of the call they describe, only
// growing), the rank's scratch block in its GPU pool (gpu::PoolBlock, remapped by peers when its
// generation changes) and the handles of its four interprocess events (posted and reduced, each
// double-buffered by call parity). In every rank's GPU pool, its scratch: [staging | reduced]
// (cuda/ipc_plan.hpp).
//
// Call k on rank r (every rank makes the same calls in the same order: the dispatcher checked it):
//  1. begin: wait (host) until every peer's done >= k-1. A rank publishes done = k-1 only after its
//     host saw its stream finish call k-1, so every peer's reads of r's scratch (and every peer's
//     stream wait on r's events) for earlier calls have completed on the GPU: r may now grow or
//     overwrite its scratch, and record its events again.
//  2. stage: copy the input into the staging area on r's stream (peers never read a user buffer:
//     the backend gets device addresses, not storages, so it cannot tell a pool tensor from
//     cudaMalloc memory; and a copy makes in-place calls safe), record the posted event, publish
//     posted = k.
//  3. for each peer: wait (host) for its posted >= k, then cudaStreamWaitEvent on its posted event:
//     r's stream now runs after the peer's staging copy.
//  4. one kernel reads every rank's staged input for r's part of the output: the whole output for
//     small calls (one pass) or r's share for large ones, written to r's reduced area, then (reduced
//     event, reduced flag, stream waits as in 2-3) a batched copy of every peer's reduced share.
//  5. finish: the host waits for r's stream (polling an event, checking the job's abort word:
//     PeerFailure when a rank died), then publishes done = k.
// No kernel reads a flag: a kernel spinning on memory another process writes can hang when the
// processes' kernels time-slice one GPU (no MPS). Only hosts wait, and only on host flags.
//
// Events and parity. A rank records its event (kind, k & 1) in call k and publishes the flag after
// cudaEventRecord returned; a peer calls cudaStreamWaitEvent only after seeing the flag, so it
// waits on that record (stream waits bind to the event's latest record when they are issued). The
// owner records the same event again in call k+2 at the earliest, after step 1 of call k+1 saw
// every peer's done >= k, i.e. after every peer's wait on the call-k record has completed. Parity
// adds a margin: the waits of consecutive calls are never on the same event at all.
#include "comm_state.hpp"
#include "gpu_backend.hpp"
#include "cuda/ipc_plan.hpp"
#include "cuda/reduce_kernels.hpp"
#include "reduce_kernels.hpp"

#include <nodal/errors.hpp>
#include <nodal/detail/gpu.hpp>
#include <nodal/detail/storage.hpp>
#include <nodal/detail/wait.hpp>

#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <sched.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include <fmt/format.h>

namespace nodal::detail {
namespace {

using namespace cuda_ipc;

constexpr std::uint64_t kIpcMagic = 0x6370692d6c646e31ULL;  // "1ndl-ipc"

/// A rank's part of the communicator's arena record.
struct alignas(kCacheLine) RankRecord {
  alignas(kCacheLine) std::atomic<std::uint64_t> posted{0};   ///< my staged input of call k is (being) written
  alignas(kCacheLine) std::atomic<std::uint64_t> reduced{0};  ///< my reduced share of call k is (being) written
  alignas(kCacheLine) std::atomic<std::uint64_t> done{0};     ///< call k finished on my GPU stream
  /// Written by the owner before it publishes posted for the call that first uses them; read by
  /// peers after they saw that flag (acquire).
  alignas(kCacheLine) gpu::PoolBlock scratch{};
  std::uint64_t scratch_generation = 0;  ///< 0: no scratch yet
  std::int32_t device = 0;
  std::int32_t pid = 0;
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

class CudaIpcBackend final : public GpuBackend {
 public:
  CudaIpcBackend(CommState& comm, int device) : comm_(comm), device_(device), n_(comm.size), me_(comm.rank) {
    if (n_ > kMaxRanks) {
      throw UsageError(fmt::format("the CUDA IPC collectives support up to {} ranks in a communicator; {} has {}",
                                   kMaxRanks, comm.name, n_));
    }
    gpu::require_available("CUDA IPC collectives");
    check(cudaSetDevice(device_), "cudaSetDevice");
    const std::size_t total = kHeaderBytes + static_cast<std::size_t>(n_) * sizeof(RankRecord);
    const std::string object = "nodal.comm-cudaipc:" + comm.name;
    auto* base = static_cast<std::byte*>(comm.arena->find_or_create(object.c_str(), total, kCacheLine, [&](void* where) {
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
    for (int slot = 0; slot < kEventsPerRank; ++slot) {
      check(cudaEventCreateWithFlags(&events_[slot], cudaEventDisableTiming | cudaEventInterprocess),
            "cudaEventCreateWithFlags(interprocess)");
      cudaIpcEventHandle_t handle;
      check(cudaIpcGetEventHandle(&handle, events_[slot]), "cudaIpcGetEventHandle");
      static_assert(sizeof(handle) == 64);
      std::memcpy(mine.events[slot].data(), &handle, sizeof handle);
    }
    check(cudaEventCreateWithFlags(&finished_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    peer_events_.resize(static_cast<std::size_t>(n_));
    for (auto& slots : peer_events_) slots.fill(nullptr);
    peer_scratch_.resize(static_cast<std::size_t>(n_));
  }

  ~CudaIpcBackend() override {
    // Peers' events first (closing is cudaEventDestroy for an opened handle), then ours. A peer may
    // still wait on ours only if the job failed; destroying a recorded event is legal anyway.
    for (auto& slots : peer_events_)
      for (cudaEvent_t event : slots)
        if (event != nullptr) cudaEventDestroy(event);
    for (cudaEvent_t event : events_)
      if (event != nullptr) cudaEventDestroy(event);
    if (finished_ != nullptr) cudaEventDestroy(finished_);
  }

  const char* name() const noexcept override { return "cuda_ipc"; }

  void allreduce(const void* input, void* output, std::size_t count, DType dtype, ReduceOp op,
                 cuda::Stream stream) override {
    const std::size_t es = element_size(dtype);
    const Algorithm algorithm = choose_algorithm(count * es, n_, one_pass_max_bytes());
    const ScratchLayout layout = scratch_layout(Kind::allreduce, algorithm, count, es, n_);
    begin(layout);
    stage(input, count * es, stream);
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
  }

  void reduce(const void* input, void* output, std::size_t count, DType dtype, ReduceOp op, int root,
              cuda::Stream stream) override {
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
      stage(input, count * es, stream);
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
      }
    }
    finish(stream);
  }

  void broadcast(void* buffer, std::size_t count, DType dtype, int root, cuda::Stream stream) override {
    const std::size_t bytes = count * element_size(dtype);
    begin(scratch_layout(Kind::broadcast, Algorithm::one_pass, count, element_size(dtype), n_));
    if (me_ == root) stage(buffer, bytes, stream);
    post(stream);
    if (me_ != root) {
      wait_peer(root, EventKind::posted, stream);
      const CopySegment segment{peer_scratch(root), buffer, bytes};
      launch_copies(&segment, 1, stream);
    }
    finish(stream);
  }

  void allgather(const void* input, void* output, std::size_t count, DType dtype, cuda::Stream stream) override {
    const std::size_t bytes = count * element_size(dtype);
    begin(scratch_layout(Kind::allgather, Algorithm::one_pass, count, element_size(dtype), n_));
    stage(input, bytes, stream);
    post(stream);
    wait_peers(EventKind::posted, stream);
    std::array<CopySegment, kMaxRanks> segments{};
    auto* out = static_cast<std::byte*>(output);
    for (int p = 0; p < n_; ++p) {
      std::byte* dst = out + static_cast<std::size_t>(p) * bytes;
      const void* src = p == me_ ? input : peer_scratch(p);
      // In place (input == output + rank * count) the own block is already there (launch_copies
      // skips src == dst); any other overlap reads the staged copy instead.
      if (p == me_ && src != dst && overlaps(src, bytes, out, static_cast<std::size_t>(n_) * bytes)) src = scratch_;
      segments[static_cast<std::size_t>(p)] = {src, dst, bytes};
    }
    launch_copies(segments.data(), n_, stream);
    finish(stream);
  }

  void reduce_scatter(const void* input, void* output, std::size_t count, DType dtype, ReduceOp op,
                      cuda::Stream stream) override {
    const std::size_t es = element_size(dtype);
    begin(scratch_layout(Kind::reduce_scatter, Algorithm::one_pass, count, es, n_));
    stage(input, static_cast<std::size_t>(n_) * count * es, stream);
    post(stream);
    wait_peers(EventKind::posted, stream);
    // Every contribution from the staged copies, this rank's too: in place (output == input +
    // rank * count) the kernel writes the user's input while reading it.
    std::array<const void*, kMaxRanks> srcs{};
    for (int p = 0; p < n_; ++p) srcs[static_cast<std::size_t>(p)] = p == me_ ? scratch_ : peer_scratch(p);
    offset_sources(srcs, static_cast<std::size_t>(me_) * count * es);
    launch_reduce(dtype, op, srcs.data(), n_, output, nullptr, count, stream);
    finish(stream);
  }

  void barrier(cuda::Stream stream) override {
    begin(scratch_layout(Kind::barrier, Algorithm::one_pass, 0, 1, n_));
    wait_stream(stream);  // this rank's queued work is done
    publish(comm_, records_[me_].posted, call_);
    for (int p = 0; p < n_; ++p)
      if (p != me_) wait_flag(comm_, records_[p].posted, call_, "CUDA IPC barrier");
    publish(comm_, records_[me_].done, call_);
  }

  void gather(const void*, void*, std::size_t, DType, int, cuda::Stream) override { unsupported("gather"); }
  void scatter(const void*, void*, std::size_t, DType, int, cuda::Stream) override { unsupported("scatter"); }
  void alltoall(const void*, void*, std::size_t, DType, cuda::Stream) override { unsupported("alltoall"); }
  void send(const void*, std::size_t, DType, int, cuda::Stream) override { unsupported("send"); }
  void recv(void*, std::size_t, DType, int, cuda::Stream) override { unsupported("recv"); }

 private:
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
    check(cudaSetDevice(device_), "cudaSetDevice");
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

  /// Every rank's contribution: this rank's own input in place, the peers' staged copies.
  void sources(std::array<const void*, kMaxRanks>& srcs, const void* input, std::size_t offset) {
    for (int p = 0; p < n_; ++p) srcs[static_cast<std::size_t>(p)] = p == me_ ? input : peer_scratch(p);
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
