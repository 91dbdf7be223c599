// The NCCL backend (gpu_backend.hpp): one NCCL communicator per nodal communicator whose ranks
// each have a GPU of their own.
//
// Start-up: rank 0 makes the ncclUniqueId and publishes it in an arena record named after the
// communicator (id_object_name), the others wait for it through the runtime's waiting helper (so a
// failed job or NODAL_NCCL_INIT_TIMEOUT ends the wait); then every rank creates its NCCL
// communicator non-blocking (ncclConfig_t::blocking = 0) and polls ncclCommGetAsyncError until
// it is ready, checking the job's abort word and the same deadline.
//
// A call: queue the NCCL work (and, for the staged reductions of nccl_plan.hpp, the widening and
// narrowing kernels) on the caller's stream, record an event after it, and poll the event, the
// job's abort word and ncclCommGetAsyncError until one of them says something. The job failed
// (a peer died: its GPU work will never arrive, and NCCL's kernels would spin forever) ->
// ncclCommAbort, which makes those kernels return, then PeerFailure naming the failed rank. An
// NCCL error -> ncclCommAbort, CudaError with NCCL's words. Either way the communicator's NCCL
// path is finished: later calls on it throw at once.
//
// A non-blocking NCCL communicator may answer any call (ncclGroupEnd included) with
// ncclInProgress; then the call's effect is in flight and NCCL demands that ncclCommGetAsyncError
// says ncclSuccess before the next NCCL call on the communicator (NCCL user guide, "Fault
// tolerance" / non-blocking communicators). settle() does that wait, with the same abort checks.
#include "gpu_backend.hpp"

#include "comm_state.hpp"
#include "nccl/nccl_kernels.hpp"
#include "nccl/nccl_plan.hpp"
#include "shm/algorithms.hpp"  // run_collective

#include <nodal/arena.hpp>
#include <nodal/errors.hpp>
#include <nodal/detail/gpu.hpp>
#include <nodal/detail/posix.hpp>
#include <nodal/detail/verbose.hpp>
#include <nodal/detail/wait.hpp>

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include <fmt/format.h>

namespace nodal::detail {
namespace {

using namespace std::chrono_literals;

/// The arena record of one NCCL communicator's ncclUniqueId (found or created by every rank).
struct alignas(64) NcclIdRecord {
  static constexpr std::uint64_t kPublished = 1;  ///< `id` is valid
  static constexpr std::uint64_t kFailed = 2;     ///< rank 0 could not make one: `error` says why
  std::atomic<std::uint64_t> state{0};
  ncclUniqueId id{};
  char error[256]{};
};

void cuda_check(cudaError_t error, const char* what) {
  if (error != cudaSuccess) {
    throw CudaError(fmt::format("NCCL backend: {}: {}: {}", what, cudaGetErrorName(error), cudaGetErrorString(error)));
  }
}

using gpu::DeviceGuard;  // restores the caller's context only when it had one

/// Polls `done` until it returns true: spinning first (the runtime's Waiter: a `pause` per round,
/// or yields when ranks outnumber cores), then yielding for a couple of milliseconds, then napping
/// with a growing sleep (50 us .. 1 ms), since a GPU's completion wakes no futex. Throws
/// PeerFailure once the job has failed, TimeoutError past `deadline` (both from Waiter::check).
template <class Done>
void poll_until(Done&& done, Deadline deadline, std::string_view what) {
  if (done()) return;
  Waiter waiter(deadline, what);
  while (waiter.spin()) {
    if (done()) return;
  }
  const auto yield_until = Clock::now() + 2ms;
  auto nap = std::chrono::microseconds(50);
  for (;;) {
    if (done()) return;
    waiter.check();
    if (Clock::now() < yield_until) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(nap);
      nap = std::min<std::chrono::microseconds>(nap * 2, 1ms);
    }
  }
}

class NcclBackend final : public GpuBackend {
 public:
  NcclBackend(CommState& comm, int device) : comm_(comm), device_(device), label_(comm.name) {
    DeviceGuard guard(device_);
    const auto started = std::chrono::steady_clock::now();
    try {
      const auto deadline = Deadline::after(nccl::init_timeout_from(getenv_or_empty("NODAL_NCCL_INIT_TIMEOUT")));
      const ncclUniqueId id = exchange_id(deadline);

      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      config.commName = label_.c_str();  // NCCL's logs name the communicator
      ncclComm_t created = nullptr;
      const ncclResult_t result = ncclCommInitRankConfig(&created, comm_.size, id, comm_.rank, &config);
      nccl_ = created;
      if (result != ncclSuccess && result != ncclInProgress) fail(result, "ncclCommInitRankConfig");
      settle(deadline, "creating the NCCL communicator (NODAL_NCCL_INIT_TIMEOUT)");

      cuda_check(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate");
      cuda_check(cudaMalloc(&barrier_word_, 64), "cudaMalloc (barrier word)");
      cuda_check(cudaMemset(barrier_word_, 0, 64), "cudaMemset (barrier word)");
      note_step(fmt::format("NCCL communicator '{}' of {} ranks created on cuda:{}", label_, comm_.size, device_),
                started);
    } catch (...) {
      // No destructor runs for a half-made object: give back what was made.
      abort_nccl("failed to start");
      if (done_ != nullptr) (void)cudaEventDestroy(done_);
      if (barrier_word_ != nullptr) (void)cudaFree(barrier_word_);
      throw;
    }
  }

  ~NcclBackend() override { close(); }

  const char* name() const noexcept override { return "nccl"; }

  void close() noexcept override {
    try {
      DeviceGuard guard(device_);
      if (nccl_ != nullptr) shut_down();
      if (done_ != nullptr) (void)cudaEventDestroy(std::exchange(done_, nullptr));
      if (barrier_word_ != nullptr) (void)cudaFree(std::exchange(barrier_word_, nullptr));
      if (scratch_ != nullptr) (void)cudaFree(std::exchange(scratch_, nullptr));
    } catch (...) {
      // Never throws; after main returns without nodal::finalize() CUDA may already be unloading.
    }
  }

  void allreduce(const void* input, void* output, std::size_t count, DType dtype, ReduceOp op,
                 cuda::Stream stream) override {
    const nccl::ReducePlan plan = plan_for(dtype, op);
    run("allreduce", stream, [&] {
      if (plan.stage == nccl::Stage::direct) {
        enqueue(ncclAllReduce(input, output, count, plan.wire, plan.op, nccl_, stream), "ncclAllReduce");
        if (plan.divide) nccl::divide_in_place(dtype, output, count, comm_.size, stream);
        return;
      }
      void* wide = scratch(count * nccl::wire_size(plan.wire));
      nccl::widen(dtype, input, wide, count, stream);
      enqueue(ncclAllReduce(wide, wide, count, plan.wire, plan.op, nccl_, stream), "ncclAllReduce");
      nccl::narrow(dtype, wide, output, count, plan.divide ? comm_.size : 1, stream);
    });
  }

  void reduce(const void* input, void* output, std::size_t count, DType dtype, ReduceOp op, int root,
              cuda::Stream stream) override {
    const nccl::ReducePlan plan = plan_for(dtype, op);
    const bool is_root = comm_.rank == root;
    run("reduce", stream, [&] {
      if (plan.stage == nccl::Stage::direct) {
        // NCCL reads recvbuff on the root only (it may be null elsewhere).
        enqueue(ncclReduce(input, is_root ? output : nullptr, count, plan.wire, plan.op, root, nccl_, stream),
                "ncclReduce");
        if (plan.divide && is_root) nccl::divide_in_place(dtype, output, count, comm_.size, stream);
        return;
      }
      void* wide = scratch(count * nccl::wire_size(plan.wire));
      nccl::widen(dtype, input, wide, count, stream);
      enqueue(ncclReduce(wide, wide, count, plan.wire, plan.op, root, nccl_, stream), "ncclReduce");
      if (is_root) nccl::narrow(dtype, wide, output, count, plan.divide ? comm_.size : 1, stream);
    });
  }

  void broadcast(void* buffer, std::size_t count, DType dtype, int root, cuda::Stream stream) override {
    run("broadcast", stream, [&] {
      enqueue(ncclBroadcast(buffer, buffer, bytes(count, dtype), ncclUint8, root, nccl_, stream), "ncclBroadcast");
    });
  }

  void allgather(const void* input, void* output, std::size_t count, DType dtype, cuda::Stream stream) override {
    // In place (input == output + rank * count) is NCCL's convention as well as nodal's.
    run("allgather", stream, [&] {
      enqueue(ncclAllGather(input, output, bytes(count, dtype), ncclUint8, nccl_, stream), "ncclAllGather");
    });
  }

  void reduce_scatter(const void* input, void* output, std::size_t count, DType dtype, ReduceOp op,
                      cuda::Stream stream) override {
    const nccl::ReducePlan plan = plan_for(dtype, op);
    const std::size_t n = static_cast<std::size_t>(comm_.size);
    run("reduce_scatter", stream, [&] {
      // In place (output == input + rank * count) is NCCL's convention as well as nodal's.
      if (plan.stage == nccl::Stage::direct) {
        enqueue(ncclReduceScatter(input, output, count, plan.wire, plan.op, nccl_, stream), "ncclReduceScatter");
        if (plan.divide) nccl::divide_in_place(dtype, output, count, comm_.size, stream);
        return;
      }
      const std::size_t wide_bytes = count * nccl::wire_size(plan.wire);
      auto* wide = static_cast<std::byte*>(scratch(n * wide_bytes));
      std::byte* mine = wide + static_cast<std::size_t>(comm_.rank) * wide_bytes;
      nccl::widen(dtype, input, wide, n * count, stream);
      enqueue(ncclReduceScatter(wide, mine, count, plan.wire, plan.op, nccl_, stream), "ncclReduceScatter");
      nccl::narrow(dtype, mine, output, count, plan.divide ? comm_.size : 1, stream);
    });
  }

  void barrier(cuda::Stream stream) override {
    // A one-byte allreduce: it starts on each rank after the work queued before it on its stream,
    // and completes on no rank before every rank's contribution arrived.
    run("barrier", stream, [&] {
      enqueue(ncclAllReduce(barrier_word_, barrier_word_, 1, ncclUint8, ncclMax, nccl_, stream), "ncclAllReduce");
    });
  }

  void gather(const void* input, void* output, std::size_t count, DType dtype, int root,
              cuda::Stream stream) override {
    const std::size_t block = bytes(count, dtype);
    run("gather", stream, [&] {
      if (comm_.rank != root) {
        enqueue(ncclSend(input, block, ncclUint8, root, nccl_, stream), "ncclSend");
        return;
      }
      group([&] {
        for (int r = 0; r < comm_.size; ++r) {
          if (r != root) enqueue(ncclRecv(at(output, r, block), block, ncclUint8, r, nccl_, stream), "ncclRecv");
        }
      });
      copy(at(output, root, block), input, block, stream);
    });
  }

  void scatter(const void* input, void* output, std::size_t count, DType dtype, int root,
               cuda::Stream stream) override {
    const std::size_t block = bytes(count, dtype);
    run("scatter", stream, [&] {
      if (comm_.rank != root) {
        enqueue(ncclRecv(output, block, ncclUint8, root, nccl_, stream), "ncclRecv");
        return;
      }
      group([&] {
        for (int r = 0; r < comm_.size; ++r) {
          if (r != root) enqueue(ncclSend(at(input, r, block), block, ncclUint8, r, nccl_, stream), "ncclSend");
        }
      });
      copy(output, at(input, root, block), block, stream);
    });
  }

  void alltoall(const void* input, void* output, std::size_t count, DType dtype, cuda::Stream stream) override {
    const std::size_t block = bytes(count, dtype);
    run("alltoall", stream, [&] {
      group([&] {
        for (int r = 0; r < comm_.size; ++r) {
          if (r == comm_.rank) continue;
          enqueue(ncclSend(at(input, r, block), block, ncclUint8, r, nccl_, stream), "ncclSend");
          enqueue(ncclRecv(at(output, r, block), block, ncclUint8, r, nccl_, stream), "ncclRecv");
        }
      });
      copy(at(output, comm_.rank, block), at(input, comm_.rank, block), block, stream);
    });
  }

  void send(const void* input, std::size_t count, DType dtype, int peer, cuda::Stream stream) override {
    // Returns once the send's kernel has finished: for NCCL that means the data has left this
    // GPU into the peer's receive buffers (for large messages, once the peer consumed most of it),
    // close to but weaker than the CPU path's rendezvous.
    run("send", stream, [&] { enqueue(ncclSend(input, bytes(count, dtype), ncclUint8, peer, nccl_, stream), "ncclSend"); });
  }

  void recv(void* output, std::size_t count, DType dtype, int peer, cuda::Stream stream) override {
    run("recv", stream, [&] { enqueue(ncclRecv(output, bytes(count, dtype), ncclUint8, peer, nccl_, stream), "ncclRecv"); });
  }

 private:
  /// Rank 0 publishes a fresh ncclUniqueId; the others wait for it (or for rank 0's failure).
  ncclUniqueId exchange_id(Deadline deadline) {
    if (comm_.across_nodes) return exchange_id_across_nodes();
    // A communicator may make its NCCL communicator more than once (after an abort, say): the
    // record is per generation, and comm_.seq (collective calls so far) is the same on every rank
    // at the call that makes it.
    const std::string object = nccl::id_object_name(comm_.name, comm_.seq);
    auto& record = comm_.arena->find_or_construct<NcclIdRecord>(object.c_str());
    if (comm_.rank == 0) {
      ncclUniqueId id{};
      const ncclResult_t result = ncclGetUniqueId(&id);
      if (result != ncclSuccess) {
        const std::string why = fmt::format("ncclGetUniqueId on rank 0 failed: {} ({})", ncclGetErrorString(result),
                                            ncclGetLastError(nullptr));
        std::snprintf(record.error, sizeof record.error, "%s", why.c_str());
        publish(comm_, record.state, NcclIdRecord::kFailed);
        throw CudaError(fmt::format("communicator {}: {}", label_, why));
      }
      record.id = id;
      publish(comm_, record.state, NcclIdRecord::kPublished);
      return id;
    }
    wait_until(
        comm_.shared->word, [&] { return record.state.load(std::memory_order_acquire) != 0; }, deadline,
        "waiting for rank 0's ncclUniqueId (NODAL_NCCL_INIT_TIMEOUT)");
    if (record.state.load(std::memory_order_acquire) != NcclIdRecord::kPublished) {
      throw CudaError(fmt::format("communicator {}: {}", label_, record.error));
    }
    return record.id;
  }

  /// Across nodes each node has its own arena: rank 0's id (or its failure) reaches every rank
  /// through a broadcast on the communicator's CPU path (every rank makes its backend at the same
  /// call, so this is one more collective call in the same place on every rank). A failed job
  /// ends it with PeerFailure; NODAL_NCCL_INIT_TIMEOUT does not bound it (a rank that never
  /// comes is named by nodalrun's --stall-timeout), only the NCCL communicator's creation after.
  ncclUniqueId exchange_id_across_nodes() {
    struct Message {
      std::uint64_t state;
      ncclUniqueId id;
      char error[256];
    } message{};
    if (comm_.rank == 0) {
      const ncclResult_t result = ncclGetUniqueId(&message.id);
      message.state = result == ncclSuccess ? NcclIdRecord::kPublished : NcclIdRecord::kFailed;
      if (result != ncclSuccess) {
        std::snprintf(message.error, sizeof message.error, "ncclGetUniqueId on rank 0 failed: %s (%s)",
                      ncclGetErrorString(result), ncclGetLastError(nullptr));
      }
    }
    run_collective(comm_, CollCall{CollKind::broadcast, &message, &message, sizeof message, DType::u8, ReduceOp::sum, 0});
    if (message.state != NcclIdRecord::kPublished) {
      throw CudaError(fmt::format("communicator {}: {}", label_, message.error));
    }
    return message.id;
  }

  nccl::ReducePlan plan_for(DType dtype, ReduceOp op) const {
    const nccl::ReducePlan plan = nccl::plan_reduce(dtype, op);
    if (!plan.defined) {
      throw UsageError(fmt::format("{} of {} is not defined", reduce_op_name(op), dtype_name(dtype)));
    }
    return plan;
  }

  static std::size_t bytes(std::size_t count, DType dtype) { return count * element_size(dtype); }
  static void* at(void* base, int block, std::size_t block_bytes) {
    return static_cast<std::byte*>(base) + static_cast<std::size_t>(block) * block_bytes;
  }
  static const void* at(const void* base, int block, std::size_t block_bytes) {
    return static_cast<const std::byte*>(base) + static_cast<std::size_t>(block) * block_bytes;
  }
  static void copy(void* dst, const void* src, std::size_t n, cuda::Stream stream) {
    if (n == 0 || dst == src) return;
    cuda_check(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync (own block)");
  }

  /// Device scratch of at least `n` bytes (grown, never shrunk; only used inside one call).
  void* scratch(std::size_t n) {
    if (n <= scratch_bytes_) return scratch_;
    if (scratch_ != nullptr) {
      // The previous call has finished (run waits), so nothing uses the old buffer any more.
      cuda_check(cudaFree(scratch_), "cudaFree (scratch)");
      scratch_ = nullptr;
      scratch_bytes_ = 0;
    }
    const std::size_t rounded = std::max<std::size_t>(n + (n >> 2), 1 << 20);
    cuda_check(cudaMalloc(&scratch_, rounded), "cudaMalloc (scratch for a staged reduction)");
    scratch_bytes_ = rounded;
    return scratch_;
  }

  void usable() const {
    if (nccl_ != nullptr) return;
    const ArenaControl& control = comm_.arena->control();
    if (control.abort.load(std::memory_order_acquire) != 0) throw_peer_failure(control);
    throw CudaError(fmt::format("communicator {}: its NCCL communicator was aborted after an earlier error ({}); "
                                "GPU collectives on it cannot go on",
                                label_, aborted_because_));
  }

  /// One call: queue the work, record the event, wait for it.
  template <class Enqueue>
  void run(const char* what, cuda::Stream stream, Enqueue&& work) {
    usable();
    DeviceGuard guard(device_);
    try {
      work();
      cuda_check(cudaEventRecord(done_, stream), "cudaEventRecord");
    } catch (const CudaError& e) {
      // Part of the call may be queued already: peers cannot rely on this rank's side any more.
      abort_nccl(e.what());
      throw;
    }
    wait_done(what);
  }

  /// The result of queuing one NCCL call: ncclInProgress is settled before the next NCCL call.
  /// Inside a group the first error is kept for after ncclGroupEnd (aborting inside a group
  /// would leave the group pointing at a freed communicator).
  void enqueue(ncclResult_t result, const char* what) {
    if (result == ncclSuccess) return;
    if (in_group_) {
      if (result != ncclInProgress && group_error_ == ncclSuccess) {
        group_error_ = result;
        group_error_what_ = what;
      }
      return;
    }
    if (result == ncclInProgress) {
      settle(Deadline{}, what);
      return;
    }
    fail(result, what);
  }

  /// ncclGroupStart, the calls, ncclGroupEnd (always, as NCCL requires), settled.
  template <class Calls>
  void group(Calls&& calls) {
    const ncclResult_t start = ncclGroupStart();
    if (start != ncclSuccess) fail(start, "ncclGroupStart");
    in_group_ = true;
    group_error_ = ncclSuccess;
    try {
      calls();
    } catch (...) {
      in_group_ = false;
      (void)ncclGroupEnd();
      abort_nccl("an error inside a group");
      throw;
    }
    in_group_ = false;
    const ncclResult_t end = ncclGroupEnd();
    if (group_error_ != ncclSuccess) fail(group_error_, group_error_what_);
    enqueue(end, "ncclGroupEnd");
  }

  /// True once the communicator is no longer ncclInProgress; throws (after aborting) on an error.
  bool ready(const char* what) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t result = ncclCommGetAsyncError(nccl_, &state);
    if (result != ncclSuccess) fail(result, "ncclCommGetAsyncError");
    if (state == ncclInProgress) return false;
    if (state != ncclSuccess) fail(state, what);
    return true;
  }

  /// Waits until the communicator is not ncclInProgress. The job failing, the communicator
  /// broken by a rank that left a call part-way (comm_state.hpp mark_comm_broken) or the deadline
  /// passing aborts the NCCL communicator first.
  void settle(Deadline deadline, const char* what) {
    try {
      poll_until(
          [&] {
            if (ready(what)) return true;
            check_comm_intact(comm_);
            return false;
          },
          deadline, what);
    } catch (const PeerFailure&) {
      abort_nccl("the job failed, or a rank left a call part-way");
      throw;
    } catch (const TimeoutError&) {
      abort_nccl("timed out");
      throw;
    }
  }

  /// Waits for the event recorded after the call's work, watching NCCL's error state, the job and
  /// the communicator (a rank whose call failed before its kernels were queued never joins them).
  void wait_done(const char* what) {
    try {
      poll_until(
          [&] {
            const cudaError_t query = cudaEventQuery(done_);
            if (query == cudaSuccess) return true;
            if (query != cudaErrorNotReady) {
              abort_nccl("a CUDA error");
              cuda_check(query, what);
            }
            (void)ready(what);  // an NCCL error throws (after aborting); otherwise keep waiting
            check_comm_intact(comm_);
            return false;
          },
          Deadline{}, what);
    } catch (const PeerFailure&) {
      abort_nccl("the job failed, or a rank left a call part-way");
      throw;
    }
  }

  [[noreturn]] void fail(ncclResult_t result, const char* what) {
    const char* last = ncclGetLastError(nccl_);
    const std::string message =
        fmt::format("communicator {} (rank {} of {}, cuda:{}): {} failed: {} ({})", label_, comm_.rank, comm_.size,
                    device_, what, ncclGetErrorString(result), last != nullptr && *last != '\0' ? last : "no detail");
    abort_nccl(message);
    throw CudaError(message);
  }

  void abort_nccl(std::string why) noexcept {
    if (nccl_ == nullptr) return;
    aborted_because_ = std::move(why);
    (void)ncclCommAbort(nccl_);  // frees the communicator; its kernels return
    nccl_ = nullptr;
  }

  /// Destruction without an error: ncclCommFinalize (non-blocking: settled, bounded, and given up
  /// for ncclCommAbort if the job fails or peers never finalize), then ncclCommDestroy.
  void shut_down() noexcept {
    const ncclResult_t finalize = ncclCommFinalize(nccl_);
    if (finalize != ncclSuccess && finalize != ncclInProgress) {
      abort_nccl("ncclCommFinalize failed");
      return;
    }
    const auto deadline = Clock::now() + 10s;
    for (auto nap = std::chrono::microseconds(10);; nap = std::min<std::chrono::microseconds>(nap * 2, 1ms)) {
      ncclResult_t state = ncclSuccess;
      if (ncclCommGetAsyncError(nccl_, &state) != ncclSuccess) state = ncclInternalError;
      if (state == ncclSuccess) break;
      if (state != ncclInProgress || Clock::now() >= deadline ||
          comm_.arena->control().abort.load(std::memory_order_acquire) != 0) {
        abort_nccl("destroyed while its peers were gone");
        return;
      }
      std::this_thread::sleep_for(nap);
    }
    (void)ncclCommDestroy(nccl_);
    nccl_ = nullptr;
  }

  CommState& comm_;
  int device_;
  std::string label_;  ///< the communicator's name, for messages and NCCL's commName
  ncclComm_t nccl_ = nullptr;
  cudaEvent_t done_ = nullptr;
  void* barrier_word_ = nullptr;
  void* scratch_ = nullptr;
  std::size_t scratch_bytes_ = 0;
  std::string aborted_because_;
  bool in_group_ = false;
  ncclResult_t group_error_ = ncclSuccess;
  const char* group_error_what_ = "";
};

}  // namespace

std::unique_ptr<GpuBackend> make_nccl_backend(CommState& comm, int device) {
  return std::make_unique<NcclBackend>(comm, device);
}

}  // namespace nodal::detail
