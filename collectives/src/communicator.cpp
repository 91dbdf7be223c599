// nodal::Communicator: checks each call's arguments on this rank, then hands it to the
// shared-memory algorithms (shm/call.hpp), or for cuda tensors has the shared-memory path
// check that every rank made the same call and hands the data to the GPU backend (gpu_backend.hpp).
#include <nodal/communicator.hpp>

#include "comm_state.hpp"
#include "gpu_backend.hpp"
#include "gpu_path.hpp"
#include "internode/across_nodes.hpp"
#include "progress.hpp"
#include "reduce_kernels.hpp"
#include "shm/algorithm_table.hpp"
#include "shm/algorithms.hpp"

#include <nodal/context.hpp>
#include <nodal/cuda.hpp>
#include <nodal/errors.hpp>
#include <nodal/detail/finalize.hpp>
#include <nodal/detail/posix.hpp>
#include <nodal/detail/storage.hpp>
#include <nodal/detail/units.hpp>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <mutex>
#include <chrono>
#include <thread>
#include <numeric>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace nodal {
namespace {

using detail::CollCall;
using detail::CollKind;

void check_reduce_op(ReduceOp op, DType dtype) {
  if (!detail::reduce_op_defined(op, dtype)) {
    throw UsageError(fmt::format("reduce op {} is not defined for dtype {}", reduce_op_name(op), dtype_name(dtype)));
  }
}

void check_root(const detail::CommState& c, int root, const char* what) {
  if (root < 0 || root >= c.size) {
    throw UsageError(fmt::format("{}: root {} is not a rank of communicator '{}' (size {})", what, root, c.name, c.size));
  }
}

void check_buffer(const void* p, std::size_t elements, const char* what, const char* which) {
  if (p == nullptr && elements != 0) throw UsageError(fmt::format("{}: {} is null but holds {} elements", what, which, elements));
}

/// A DType value from outside the enum (cast from a number) has no element size.
void check_dtype(DType dtype, const char* what) {
  if (element_size(dtype) == 0) {
    throw UsageError(fmt::format("{}: dtype value {} is not a nodal::DType", what, static_cast<int>(dtype)));
  }
}

/// A valid dtype; count * world_size must not overflow, nor count * element size.
void check_count(std::size_t count, DType dtype, int world_size, const char* what) {
  check_dtype(dtype, what);
  std::size_t total = 0;  // multiplications, not divisions: this runs on every call
  if (__builtin_mul_overflow(count, element_size(dtype), &total) ||
      __builtin_mul_overflow(total, static_cast<std::size_t>(world_size), &total)) {
    throw UsageError(fmt::format("{}: count {} is too large", what, count));
  }
}

void check_tensor(const Tensor& t, const char* what, const char* which) {
  if (!t.defined()) throw UsageError(fmt::format("{}: the {} tensor is undefined", what, which));
  if (!t.is_contiguous()) throw UsageError(fmt::format("{}: the {} tensor is not contiguous (call .contiguous())", what, which));
}

void check_same_dtype(const Tensor& a, const Tensor& b, const char* what) {
  if (a.dtype() != b.dtype()) {
    throw UsageError(fmt::format("{}: input dtype {} and output dtype {} differ", what, dtype_name(a.dtype()), dtype_name(b.dtype())));
  }
}

void check_numel(const Tensor& t, std::size_t expected, const char* what, const char* which) {
  if (static_cast<std::size_t>(t.numel()) != expected) {
    throw UsageError(fmt::format("{}: the {} tensor has {} elements, expected {}", what, which, t.numel(), expected));
  }
}

void check_device_arg(Device device, const char* what) {
  if (device.kind == Device::Kind::cuda && device.index < 0) {
    throw UsageError(fmt::format("{}: device cuda:{} has a negative index", what, device.index));
  }
}

void check_peer(const detail::CommState& c, int peer, const char* what) {
  if (peer < 0 || peer >= c.size || peer == c.rank) {
    throw UsageError(fmt::format("{}: peer {} is not another rank of communicator '{}' (size {}, this rank {})", what,
                                 peer, c.name, c.size, c.rank));
  }
}

std::size_t numel(const Tensor& t) { return static_cast<std::size_t>(t.numel()); }

/// Runs `body` now, or, while calls are queued on the communicator's progress thread (it made a
/// non-blocking call), queued behind them, and waits for it: calls run in the order they were made.
/// The call may write the caller's buffers, so this returns only once it has ended, also when the
/// job failed meanwhile (then the call itself stops promptly: every wait in it checks the abort word).
template <class Body>
void in_call_order(detail::CommState& c, const char* what, Body body) {
  if (!c.worker || c.worker->on_this_thread() || c.worker->idle()) return body();
  auto work = c.worker->submit(std::move(body), fmt::format("{} on communicator '{}'", what, c.name));
  try {
    detail::wait_work(*work, std::nullopt);
  } catch (...) {
    while (!work->done.load(std::memory_order_acquire)) std::this_thread::sleep_for(std::chrono::microseconds(50));
    throw;
  }
}

std::shared_ptr<detail::CommState>& world_state() {
  static std::shared_ptr<detail::CommState> state;
  return state;
}

}  // namespace

Communicator world_communicator() {
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  auto& state = world_state();
  if (!state) {
    Context ctx = init();
    if (ctx.local_world_size() != ctx.world_size()) {
      // nodalrun in multi-node mode: this node's ranks are some of the job's.
      state = detail::open_world_across_nodes(ctx.arena(), ctx.rank(), ctx.world_size());
    } else {
      std::vector<int> ranks(static_cast<std::size_t>(ctx.world_size()));
      std::iota(ranks.begin(), ranks.end(), 0);
      state = detail::open_comm(ctx.arena(), "world", ctx.rank(), std::move(ranks));
    }
  }
  return Communicator(state);
}

Communicator Context::world() const { return world_communicator(); }

detail::CommState& Communicator::state() const {
  if (!state_) throw UsageError("invalid communicator (this rank passed a negative color to split)");
  return *state_;
}

int Communicator::rank() const { return state().rank; }
int Communicator::world_size() const { return state().size; }
int Communicator::global_rank(int rank) const {
  const auto& c = state();
  if (rank < 0 || rank >= c.size) throw UsageError(fmt::format("global_rank: {} is not a rank of '{}'", rank, c.name));
  return c.global_ranks[rank];
}
std::string Communicator::last_algorithm() const { return state().last_algorithm.load(std::memory_order_relaxed); }

namespace {
/// The communicator `name` of `global` (its members' global ranks in rank order) made from `c`:
/// on the shared-memory path when its members share a node, else over send/recv between them
/// (internode/across_nodes.hpp; `made_by_members`: create_group).
std::shared_ptr<detail::CommState> open_child(const detail::CommState& c, std::string name, int rank,
                                              std::vector<int> global, bool made_by_members) {
  if (c.across_nodes && !detail::on_this_node(c, global)) {
    return detail::open_group_across_nodes(c, std::move(name), rank, std::move(global), made_by_members);
  }
  return detail::open_comm(*c.arena, std::move(name), rank, std::move(global));
}
}  // namespace

Communicator Communicator::split(int color, int key) const {
  auto& c = state();
  if (c.worker && !c.worker->on_this_thread() && !c.worker->idle()) {
    auto result = std::make_shared<Communicator>();
    in_call_order(c, "split", [self = *this, result, color, key] { *result = self.split(color, key); });
    return *result;
  }
  std::int32_t mine[2] = {color, key};
  std::vector<std::int32_t> all(2 * static_cast<std::size_t>(c.size));
  detail::run_collective(c, CollCall{CollKind::split, mine, all.data(), 2, DType::i32, ReduceOp::sum, -1});
  const int index = c.splits++;
  if (color < 0) return Communicator();
  std::vector<int> members;
  for (int j = 0; j < c.size; ++j) {
    if (all[2 * j] == color) members.push_back(j);
  }
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) { return all[2 * a + 1] < all[2 * b + 1]; });
  int my_rank = static_cast<int>(std::find(members.begin(), members.end(), c.rank) - members.begin());
  std::vector<int> global;
  for (int j : members) global.push_back(c.global_ranks[j]);
  return Communicator(open_child(c, fmt::format("{}/{}:{}", c.name, index, color), my_rank, std::move(global), false));
}

Communicator Communicator::create_group(const std::vector<int>& ranks, std::string_view tag) const {
  auto& c = state();
  if (ranks.empty()) throw UsageError(fmt::format("create_group on '{}': the list of ranks is empty", c.name));
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] < 0 || sorted[i] >= c.size) {
      throw UsageError(fmt::format("create_group on '{}': {} is not a rank of it (size {})", c.name, sorted[i], c.size));
    }
    if (i > 0 && sorted[i] == sorted[i - 1]) {
      throw UsageError(fmt::format("create_group on '{}': rank {} is listed twice", c.name, sorted[i]));
    }
  }
  const auto mine = std::find(ranks.begin(), ranks.end(), c.rank);
  if (mine == ranks.end()) {
    throw UsageError(fmt::format("create_group on '{}': this rank ({}) is not in the list {}: only members make a group",
                                 c.name, c.rank, fmt::join(ranks, ",")));
  }
  // Named by the set and the tag, so that members listing it in different orders meet in one
  // communicator, where open_comm tells them apart by the order's hash.
  const std::uint64_t key = detail::members_hash(sorted, tag);
  const int index = c.groups[key]++;
  std::vector<int> global;
  for (int j : ranks) global.push_back(c.global_ranks[static_cast<std::size_t>(j)]);
  return Communicator(open_child(c, fmt::format("{}/group:{:016x}#{}", c.name, key, index),
                                 static_cast<int>(mine - ranks.begin()), std::move(global), true));
}

// ---- Raw buffers: check this rank's arguments, then run the call on the shared-memory path. ----
// The *_call functions are shared with the Tensor overloads, which may run on a GPU instead.

namespace {

CollCall allreduce_call(const detail::CommState& c, const void* input, void* output, std::size_t count, DType dtype,
                        ReduceOp op) {
  check_reduce_op(op, dtype);
  check_count(count, dtype, c.size, "allreduce");
  check_buffer(input, count, "allreduce", "input");
  check_buffer(output, count, "allreduce", "output");
  return CollCall{CollKind::allreduce, input, output, count, dtype, op, -1};
}

CollCall reduce_call(const detail::CommState& c, const void* input, void* output, std::size_t count, DType dtype,
                     ReduceOp op, int root) {
  check_reduce_op(op, dtype);
  check_root(c, root, "reduce");
  check_count(count, dtype, c.size, "reduce");
  check_buffer(input, count, "reduce", "input");
  if (c.rank == root) check_buffer(output, count, "reduce", "output");
  return CollCall{CollKind::reduce, input, output, count, dtype, op, root};
}

CollCall broadcast_call(const detail::CommState& c, void* buffer, std::size_t count, DType dtype, int root) {
  check_root(c, root, "broadcast");
  check_count(count, dtype, c.size, "broadcast");
  check_buffer(buffer, count, "broadcast", "buffer");
  return CollCall{CollKind::broadcast, buffer, buffer, count, dtype, ReduceOp::sum, root};
}

CollCall allgather_call(const detail::CommState& c, const void* input, void* output, std::size_t count, DType dtype) {
  check_count(count, dtype, c.size, "allgather");
  check_buffer(input, count, "allgather", "input");
  check_buffer(output, count * c.size, "allgather", "output");
  return CollCall{CollKind::allgather, input, output, count, dtype, ReduceOp::sum, -1};
}

CollCall reduce_scatter_call(const detail::CommState& c, const void* input, void* output, std::size_t count,
                             DType dtype, ReduceOp op) {
  check_reduce_op(op, dtype);
  check_count(count, dtype, c.size, "reduce_scatter");
  check_buffer(input, count * c.size, "reduce_scatter", "input");
  check_buffer(output, count, "reduce_scatter", "output");
  return CollCall{CollKind::reduce_scatter, input, output, count, dtype, op, -1};
}

CollCall gather_call(const detail::CommState& c, const void* input, void* output, std::size_t count, DType dtype,
                     int root) {
  check_root(c, root, "gather");
  check_count(count, dtype, c.size, "gather");
  check_buffer(input, count, "gather", "input");
  if (c.rank == root) check_buffer(output, count * c.size, "gather", "output");
  return CollCall{CollKind::gather, input, output, count, dtype, ReduceOp::sum, root};
}

CollCall scatter_call(const detail::CommState& c, const void* input, void* output, std::size_t count, DType dtype,
                      int root) {
  check_root(c, root, "scatter");
  check_count(count, dtype, c.size, "scatter");
  if (c.rank == root) check_buffer(input, count * c.size, "scatter", "input");
  check_buffer(output, count, "scatter", "output");
  return CollCall{CollKind::scatter, c.rank == root ? input : nullptr, output, count, dtype, ReduceOp::sum, root};
}

CollCall alltoall_call(const detail::CommState& c, const void* input, void* output, std::size_t count, DType dtype) {
  check_count(count, dtype, c.size, "alltoall");
  check_buffer(input, count * c.size, "alltoall", "input");
  check_buffer(output, count * c.size, "alltoall", "output");
  if (input == output && count != 0 && c.size > 1) throw UsageError("alltoall: input and output must not overlap");
  return CollCall{CollKind::alltoall, input, output, count, dtype, ReduceOp::sum, -1};
}

CollCall barrier_call() { return CollCall{CollKind::barrier, nullptr, nullptr, 0, DType::u8, ReduceOp::sum, -1}; }

// ---- The GPU path (gpu_backend.hpp). ----

/// Every GPU backend this process opened, closed by nodal::finalize() (detail/finalize.hpp) while
/// CUDA still runs. Never destroyed: finalize may run from an atexit handler.
struct OpenBackends {
  std::mutex mutex;
  std::vector<std::weak_ptr<detail::GpuBackend>> backends;
  bool closed = false;  ///< finalize ran: a backend opened later is closed at once
};
OpenBackends& open_backends() {
  static auto* open = [] {
    auto* o = new OpenBackends;
    detail::at_finalize([o] {
      std::vector<std::shared_ptr<detail::GpuBackend>> live;
      {
        std::lock_guard lock(o->mutex);
        for (auto& weak : o->backends)
          if (auto backend = weak.lock()) live.push_back(std::move(backend));
        o->backends.clear();
        o->closed = true;
      }
      for (auto& backend : live) backend->close();
    });
    return o;
  }();
  return *open;
}

/// The communicator's GPU backend for `device`, made at its first GPU call: every rank's GPU
/// UUID is gathered (on the shared-memory path) and the same path is chosen on every rank.
void refuse_after_finalize(const detail::CommState& c) {
  if (detail::finalized()) {
    throw UsageError(fmt::format("communicator '{}': a call on cuda tensors after nodal::finalize() (it released "
                                 "the GPU backends; call it once the last GPU collective has returned)",
                                 c.name));
  }
}

detail::GpuBackend& gpu_backend(detail::CommState& c, int device) {
  refuse_after_finalize(c);
  if (c.gpu) {
    if (c.gpu_device != device) {
      throw UsageError(fmt::format("communicator '{}' runs its GPU calls on cuda:{}; a tensor on cuda:{} cannot join "
                                   "them (copy it with Tensor::to, or use one device per rank)",
                                   c.name, c.gpu_device, device));
    }
    return *c.gpu;
  }
  const detail::GpuUuid mine = detail::gpu_uuid(device);
  std::vector<detail::GpuUuid> all(static_cast<std::size_t>(c.size));
  detail::run_collective(c, CollCall{CollKind::allgather, mine.data(), all.data(), mine.size(), DType::u8,
                                     ReduceOp::sum, -1});
  const detail::GpuPath path =
      detail::choose_gpu_path(all, cuda::built_with_nccl(), detail::getenv_or_empty("NODAL_GPU_BACKEND"),
                              c.across_nodes != nullptr);
  c.gpu = path == detail::GpuPath::nccl ? detail::make_nccl_backend(c, device)
                                        : detail::make_cuda_ipc_backend(c, device);
  c.gpu_device = device;
  {
    OpenBackends& open = open_backends();
    std::unique_lock lock(open.mutex);
    if (open.closed) {  // finalize ran while this one opened
      lock.unlock();
      c.gpu->close();
      refuse_after_finalize(c);
    }
    open.backends.push_back(c.gpu);
  }
  detail::finalize_at_exit();  // after the backend's CUDA and NCCL set-up: runs before their teardown
  return *c.gpu;
}

void run_on_gpu(detail::CommState& c, CollCall call, Device device);
void run_on_worker(detail::CommState& c, const CollCall& call, Device device);

/// Runs a checked call here: on the shared-memory path, or (on_gpu) agreement there and the data
/// on the GPU backend.
inline void run_here(detail::CommState& c, const CollCall& call, Device device) {
  if (device.kind == Device::Kind::cpu) return detail::run_collective(c, call);
  run_on_gpu(c, call, device);
}

/// Runs a checked call, on the progress thread when the communicator has one. Small and inline:
/// a small call's whole cost is code like this (bench/results/2026-11-28-small-call-path.md).
inline void run(detail::CommState& c, const CollCall& call, Device device) {
  if (!c.worker || c.worker->on_this_thread() || c.worker->idle()) return run_here(c, call, device);
  run_on_worker(c, call, device);
}

[[gnu::noinline]] void run_on_worker(detail::CommState& c, const CollCall& call, Device device) {
  in_call_order(c, detail::coll_kind_name(call.kind),
                [state = c.shared_from_this(), call, device] { run_here(*state, call, device); });
}

[[gnu::noinline]] void run_on_gpu(detail::CommState& c, CollCall call, Device device) {
  refuse_after_finalize(c);  // before the agreement: peers would wait for this rank's GPU part
  call.on_gpu = true;
  detail::run_collective(c, call);  // every rank made this same call, or UsageError everywhere
  try {
    detail::GpuBackend& gpu = gpu_backend(c, device.index);  // its set-up waits for the peers' too
    c.last_algorithm.store(gpu.name(), std::memory_order_relaxed);
    const cuda::Stream stream = cuda::current_stream();
    switch (call.kind) {
      case CollKind::allreduce: return gpu.allreduce(call.input, call.output, call.count, call.dtype, call.op, stream);
      case CollKind::reduce:
        return gpu.reduce(call.input, call.output, call.count, call.dtype, call.op, call.root, stream);
      case CollKind::broadcast: return gpu.broadcast(call.output, call.count, call.dtype, call.root, stream);
      case CollKind::allgather: return gpu.allgather(call.input, call.output, call.count, call.dtype, stream);
      case CollKind::reduce_scatter:
        return gpu.reduce_scatter(call.input, call.output, call.count, call.dtype, call.op, stream);
      case CollKind::gather: return gpu.gather(call.input, call.output, call.count, call.dtype, call.root, stream);
      case CollKind::scatter: return gpu.scatter(call.input, call.output, call.count, call.dtype, call.root, stream);
      case CollKind::alltoall: return gpu.alltoall(call.input, call.output, call.count, call.dtype, stream);
      case CollKind::barrier: return gpu.barrier(stream);
      default: break;  // split and the v-variants never reach the GPU path
    }
  } catch (const std::exception& e) {
    // The agreement is done (a mismatch threw before it): the peers may wait for this rank's flags
    // (CUDA IPC) or kernels (NCCL), whatever this rank's error, a UsageError of its own included
    // (its tensor on another device than the communicator's, NODAL_GPU_BACKEND set differently).
    detail::mark_comm_broken(c, call.kind, c.seq, e);
    throw;
  }
  throw UsageError("internal: a split on the GPU path");
}

/// The device of a call's tensors: both on the same one (an undefined output, allowed on non-root
/// ranks of rooted calls, takes the input's).
Device call_device(const Tensor& input, const Tensor& output, const char* what) {
  if (!output.defined()) return input.device();
  if (!input.defined()) return output.device();
  if (input.device() != output.device()) {
    throw UsageError(fmt::format("{}: the input is on {} but the output on {}; both must be on one device", what,
                                 device_name(input.device()), device_name(output.device())));
  }
  return input.device();
}

/// send/recv of cuda tensors: the backend exists only after a collective GPU call (making it is
/// collective, and a send involves two ranks).
detail::GpuBackend& p2p_backend(detail::CommState& c, Device device, const char* what) {
  if (!c.gpu) {
    throw UsageError(fmt::format("{} of a cuda tensor on communicator '{}': make one collective call on cuda tensors "
                                 "first (e.g. barrier(Device::cuda(i))); it sets up the GPU path",
                                 what, c.name));
  }
  return gpu_backend(c, device.index);
}

}  // namespace

void Communicator::allreduce(const void* input, void* output, std::size_t count, DType dtype, ReduceOp op) {
  auto& c = state();
  run(c, allreduce_call(c, input, output, count, dtype, op), Device{});
}

void Communicator::reduce(const void* input, void* output, std::size_t count, DType dtype, ReduceOp op, int root) {
  auto& c = state();
  run(c, reduce_call(c, input, output, count, dtype, op, root), Device{});
}

void Communicator::broadcast(void* buffer, std::size_t count, DType dtype, int root) {
  auto& c = state();
  run(c, broadcast_call(c, buffer, count, dtype, root), Device{});
}

void Communicator::allgather(const void* input, void* output, std::size_t count, DType dtype) {
  auto& c = state();
  run(c, allgather_call(c, input, output, count, dtype), Device{});
}

void Communicator::reduce_scatter(const void* input, void* output, std::size_t count, DType dtype, ReduceOp op) {
  auto& c = state();
  run(c, reduce_scatter_call(c, input, output, count, dtype, op), Device{});
}

void Communicator::gather(const void* input, void* output, std::size_t count, DType dtype, int root) {
  auto& c = state();
  run(c, gather_call(c, input, output, count, dtype, root), Device{});
}

void Communicator::scatter(const void* input, void* output, std::size_t count, DType dtype, int root) {
  auto& c = state();
  run(c, scatter_call(c, input, output, count, dtype, root), Device{});
}

void Communicator::alltoall(const void* input, void* output, std::size_t count, DType dtype) {
  auto& c = state();
  run(c, alltoall_call(c, input, output, count, dtype), Device{});
}

// ---- v-variants (shm/vector_collectives.hpp): this rank's arguments here, the peers' there. ----

namespace {

/// Checks a counts argument of `what` (world_size entries, a total that fits) and returns its sum.
std::size_t check_counts(const detail::CommState& c, const std::vector<std::size_t>& counts, DType dtype,
                         const char* what, const char* which) {
  if (counts.size() != static_cast<std::size_t>(c.size)) {
    throw UsageError(fmt::format("{}: {} has {} entries; communicator '{}' has {} ranks", what, which, counts.size(),
                                 c.name, c.size));
  }
  check_dtype(dtype, what);
  std::size_t total = 0;
  for (std::size_t count : counts) {
    if (count > SIZE_MAX / element_size(dtype) - total) throw UsageError(fmt::format("{}: {} add up to too much", what, which));
    total += count;
  }
  return total;
}

CollCall vector_call(CollKind kind, const void* input, void* output, std::size_t count, DType dtype, ReduceOp op,
                     int root, const std::vector<std::size_t>* counts, const std::vector<std::size_t>* recv_counts) {
  CollCall call{kind, input, output, count, dtype, op, root};
  call.counts = counts && !counts->empty() ? counts->data() : nullptr;
  call.recv_counts = recv_counts && !recv_counts->empty() ? recv_counts->data() : nullptr;
  return call;
}

}  // namespace

void Communicator::allgatherv(const void* input, std::size_t count, void* output, const std::vector<std::size_t>& counts,
                              DType dtype) {
  auto& c = state();
  check_count(count, dtype, 1, "allgatherv");
  check_buffer(input, count, "allgatherv", "input");
  check_buffer(output, check_counts(c, counts, dtype, "allgatherv", "counts"), "allgatherv", "output");
  run(c, vector_call(CollKind::allgatherv, input, output, count, dtype, ReduceOp::sum, -1, &counts, nullptr), Device{});
}

void Communicator::gatherv(const void* input, std::size_t count, void* output, const std::vector<std::size_t>& counts,
                           DType dtype, int root) {
  auto& c = state();
  check_root(c, root, "gatherv");
  check_count(count, dtype, 1, "gatherv");
  check_buffer(input, count, "gatherv", "input");
  if (c.rank == root) check_buffer(output, check_counts(c, counts, dtype, "gatherv", "counts"), "gatherv", "output");
  run(c, vector_call(CollKind::gatherv, input, output, count, dtype, ReduceOp::sum, root, c.rank == root ? &counts : nullptr,
                     nullptr),
      Device{});
}

void Communicator::scatterv(const void* input, const std::vector<std::size_t>& counts, void* output, std::size_t count,
                            DType dtype, int root) {
  auto& c = state();
  check_root(c, root, "scatterv");
  check_count(count, dtype, 1, "scatterv");
  check_buffer(output, count, "scatterv", "output");
  if (c.rank == root) check_buffer(input, check_counts(c, counts, dtype, "scatterv", "counts"), "scatterv", "input");
  run(c, vector_call(CollKind::scatterv, input, output, count, dtype, ReduceOp::sum, root, c.rank == root ? &counts : nullptr,
                     nullptr),
      Device{});
}

void Communicator::alltoallv(const void* input, const std::vector<std::size_t>& send_counts, void* output,
                             const std::vector<std::size_t>& recv_counts, DType dtype) {
  auto& c = state();
  const std::size_t sent = check_counts(c, send_counts, dtype, "alltoallv", "send_counts");
  const std::size_t received = check_counts(c, recv_counts, dtype, "alltoallv", "recv_counts");
  check_buffer(input, sent, "alltoallv", "input");
  check_buffer(output, received, "alltoallv", "output");
  if (input == output && sent != 0 && received != 0) throw UsageError("alltoallv: input and output must not overlap");
  run(c, vector_call(CollKind::alltoallv, input, output, sent, dtype, ReduceOp::sum, -1, &send_counts, &recv_counts),
      Device{});
}

void Communicator::reduce_scatterv(const void* input, void* output, const std::vector<std::size_t>& counts, DType dtype,
                                   ReduceOp op) {
  auto& c = state();
  check_reduce_op(op, dtype);
  const std::size_t total = check_counts(c, counts, dtype, "reduce_scatterv", "counts");
  check_buffer(input, total, "reduce_scatterv", "input");
  check_buffer(output, counts[static_cast<std::size_t>(c.rank)], "reduce_scatterv", "output");
  run(c, vector_call(CollKind::reduce_scatterv, input, output, counts[static_cast<std::size_t>(c.rank)], dtype, op, -1,
                     &counts, nullptr),
      Device{});
}

void Communicator::barrier() { run(state(), barrier_call(), Device{}); }

void Communicator::barrier(Device device) {
  check_device_arg(device, "barrier");
  run(state(), barrier_call(), device);
}

void Communicator::send(const void* input, std::size_t count, DType dtype, int peer, int tag) {
  check_dtype(dtype, "send");
  check_buffer(input, count, "send", "input");
  detail::send_message(state(), input, count, dtype, peer, tag);
}

void Communicator::recv(void* output, std::size_t count, DType dtype, int peer, int tag) {
  check_dtype(dtype, "recv");
  check_buffer(output, count, "recv", "output");
  detail::recv_message(state(), output, count, dtype, peer, tag);
}

// ---- Tensors: the same calls, on the tensors' device; blocking or not. ----

namespace {

/// A Tensor call checked on this rank: what to run, on which device, and the tensors a
/// non-blocking call keeps alive until it completes.
struct TensorCall {
  CollCall call;
  Device device;
  Tensor input, output;
};

TensorCall allreduce_tensors(const detail::CommState& c, const Tensor& input, const Tensor& output, ReduceOp op) {
  check_tensor(input, "allreduce", "input");
  check_tensor(output, "allreduce", "output");
  check_same_dtype(input, output, "allreduce");
  check_numel(output, numel(input), "allreduce", "output");
  return {allreduce_call(c, input.data(), output.data(), numel(input), input.dtype(), op),
          call_device(input, output, "allreduce"), input, output};
}

TensorCall reduce_tensors(const detail::CommState& c, const Tensor& tensor, ReduceOp op, int root) {
  check_tensor(tensor, "reduce", "input");
  return {reduce_call(c, tensor.data(), tensor.data(), numel(tensor), tensor.dtype(), op, root), tensor.device(),
          tensor, tensor};
}

TensorCall broadcast_tensors(const detail::CommState& c, const Tensor& tensor, int root) {
  check_tensor(tensor, "broadcast", "input");
  return {broadcast_call(c, tensor.data(), numel(tensor), tensor.dtype(), root), tensor.device(), tensor, tensor};
}

TensorCall allgather_tensors(const detail::CommState& c, const Tensor& input, const Tensor& output) {
  check_tensor(input, "allgather", "input");
  check_tensor(output, "allgather", "output");
  check_same_dtype(input, output, "allgather");
  check_numel(output, numel(input) * c.size, "allgather", "output");
  return {allgather_call(c, input.data(), output.data(), numel(input), input.dtype()),
          call_device(input, output, "allgather"), input, output};
}

TensorCall reduce_scatter_tensors(const detail::CommState& c, const Tensor& input, const Tensor& output, ReduceOp op) {
  check_tensor(input, "reduce_scatter", "input");
  check_tensor(output, "reduce_scatter", "output");
  check_same_dtype(input, output, "reduce_scatter");
  check_numel(input, numel(output) * c.size, "reduce_scatter", "input");
  return {reduce_scatter_call(c, input.data(), output.data(), numel(output), output.dtype(), op),
          call_device(input, output, "reduce_scatter"), input, output};
}

TensorCall gather_tensors(const detail::CommState& c, const Tensor& input, const Tensor& output, int root) {
  check_tensor(input, "gather", "input");
  if (c.rank == root) {
    check_tensor(output, "gather", "output");
    check_same_dtype(input, output, "gather");
    check_numel(output, numel(input) * c.size, "gather", "output");
  }
  return {gather_call(c, input.data(), output.defined() ? output.data() : nullptr, numel(input), input.dtype(), root),
          call_device(input, output, "gather"), input, output};
}

TensorCall scatter_tensors(const detail::CommState& c, const Tensor& input, const Tensor& output, int root) {
  check_tensor(output, "scatter", "output");
  if (c.rank == root) {
    check_tensor(input, "scatter", "input");
    check_same_dtype(input, output, "scatter");
    check_numel(input, numel(output) * c.size, "scatter", "input");
  }
  return {scatter_call(c, input.defined() ? input.data() : nullptr, output.data(), numel(output), output.dtype(), root),
          call_device(input, output, "scatter"), input, output};
}

TensorCall alltoall_tensors(const detail::CommState& c, const Tensor& input, const Tensor& output) {
  check_tensor(input, "alltoall", "input");
  check_tensor(output, "alltoall", "output");
  check_same_dtype(input, output, "alltoall");
  check_numel(output, numel(input), "alltoall", "output");
  if (numel(input) % c.size != 0) {
    throw UsageError(fmt::format("alltoall: {} elements do not split into {} equal blocks", numel(input), c.size));
  }
  return {alltoall_call(c, input.data(), output.data(), numel(input) / c.size, input.dtype()),
          call_device(input, output, "alltoall"), input, output};
}

/// Queues a checked call on the communicator's progress thread (made now if it has none) and
/// returns its Work; the closure keeps the state and the tensors alive until the call ran.
std::shared_ptr<detail::WorkState> start(const std::shared_ptr<detail::CommState>& state, TensorCall t,
                                         const char* what) {
  detail::CommState& c = *state;
  if (!c.worker) c.worker = std::make_shared<detail::ProgressThread>();
  return c.worker->submit([state, t = std::move(t)] { run(*state, t.call, t.device); },
                          fmt::format("{} on communicator '{}'", what, c.name));
}

}  // namespace

void Communicator::allreduce(Tensor& tensor, ReduceOp op) { allreduce(tensor, tensor, op); }

void Communicator::allreduce(const Tensor& input, Tensor& output, ReduceOp op) {
  auto& c = state();
  TensorCall t = allreduce_tensors(c, input, output, op);
  run(c, t.call, t.device);
}

void Communicator::reduce(Tensor& tensor, ReduceOp op, int root) {
  auto& c = state();
  TensorCall t = reduce_tensors(c, tensor, op, root);
  run(c, t.call, t.device);
}

void Communicator::broadcast(Tensor& tensor, int root) {
  auto& c = state();
  TensorCall t = broadcast_tensors(c, tensor, root);
  run(c, t.call, t.device);
}

void Communicator::allgather(const Tensor& input, Tensor& output) {
  auto& c = state();
  TensorCall t = allgather_tensors(c, input, output);
  run(c, t.call, t.device);
}

void Communicator::reduce_scatter(const Tensor& input, Tensor& output, ReduceOp op) {
  auto& c = state();
  TensorCall t = reduce_scatter_tensors(c, input, output, op);
  run(c, t.call, t.device);
}

void Communicator::gather(const Tensor& input, Tensor& output, int root) {
  auto& c = state();
  TensorCall t = gather_tensors(c, input, output, root);
  run(c, t.call, t.device);
}

void Communicator::scatter(const Tensor& input, Tensor& output, int root) {
  auto& c = state();
  TensorCall t = scatter_tensors(c, input, output, root);
  run(c, t.call, t.device);
}

void Communicator::alltoall(const Tensor& input, Tensor& output) {
  auto& c = state();
  TensorCall t = alltoall_tensors(c, input, output);
  run(c, t.call, t.device);
}

namespace {

/// The element counts of a v-variant's Tensor form, checked (no negative entry).
std::vector<std::size_t> element_counts(const std::vector<std::int64_t>& counts, const char* what) {
  std::vector<std::size_t> out;
  out.reserve(counts.size());
  for (std::int64_t count : counts) {
    if (count < 0) throw UsageError(fmt::format("{}: a negative count ({})", what, count));
    out.push_back(static_cast<std::size_t>(count));
  }
  return out;
}

/// The v-variants take contiguous cpu tensors of one dtype, with the element counts they name.
void check_vector_tensors(const Tensor& input, const Tensor& output, const char* what, bool input_used,
                          bool output_used) {
  for (auto [t, which, used] : {std::tuple{&input, "input", input_used}, {&output, "output", output_used}}) {
    if (!used) continue;
    check_tensor(*t, what, which);
    if (t->device().kind != Device::Kind::cpu) {
      throw UsageError(fmt::format("{}: the {} tensor is on {}; the v-variants take cpu tensors for now (copy it with "
                                   "Tensor::to)",
                                   what, which, device_name(t->device())));
    }
  }
  if (input_used && output_used) check_same_dtype(input, output, what);
}

std::size_t total(const std::vector<std::size_t>& counts) {
  return std::accumulate(counts.begin(), counts.end(), std::size_t{0});
}

}  // namespace

void Communicator::allgatherv(const Tensor& input, Tensor& output, const std::vector<std::int64_t>& counts) {
  check_vector_tensors(input, output, "allgatherv", true, true);
  const auto n = element_counts(counts, "allgatherv");
  check_numel(output, total(n), "allgatherv", "output");
  allgatherv(input.data(), numel(input), output.data(), n, input.dtype());
}

void Communicator::gatherv(const Tensor& input, Tensor& output, const std::vector<std::int64_t>& counts, int root) {
  const bool root_here = rank() == root;
  check_vector_tensors(input, output, "gatherv", true, root_here);
  const auto n = element_counts(counts, "gatherv");
  if (root_here) check_numel(output, total(n), "gatherv", "output");
  gatherv(input.data(), numel(input), root_here ? output.data() : nullptr, n, input.dtype(), root);
}

void Communicator::scatterv(const Tensor& input, Tensor& output, const std::vector<std::int64_t>& counts, int root) {
  const bool root_here = rank() == root;
  check_vector_tensors(input, output, "scatterv", root_here, true);
  const auto n = element_counts(counts, "scatterv");
  if (root_here) check_numel(input, total(n), "scatterv", "input");
  scatterv(root_here ? input.data() : nullptr, n, output.data(), numel(output), output.dtype(), root);
}

void Communicator::alltoallv(const Tensor& input, Tensor& output, const std::vector<std::int64_t>& input_split_sizes,
                             const std::vector<std::int64_t>& output_split_sizes) {
  check_vector_tensors(input, output, "alltoallv", true, true);
  const auto send = element_counts(input_split_sizes, "alltoallv");
  const auto receive = element_counts(output_split_sizes, "alltoallv");
  check_numel(input, total(send), "alltoallv", "input");
  check_numel(output, total(receive), "alltoallv", "output");
  alltoallv(input.data(), send, output.data(), receive, input.dtype());
}

void Communicator::reduce_scatterv(const Tensor& input, Tensor& output, const std::vector<std::int64_t>& counts,
                                   ReduceOp op) {
  check_vector_tensors(input, output, "reduce_scatterv", true, true);
  const auto n = element_counts(counts, "reduce_scatterv");
  check_numel(input, total(n), "reduce_scatterv", "input");
  if (n.size() == static_cast<std::size_t>(world_size())) {
    check_numel(output, n[static_cast<std::size_t>(rank())], "reduce_scatterv", "output");
  }
  reduce_scatterv(input.data(), output.data(), n, input.dtype(), op);
}

Work Communicator::iallreduce(Tensor& tensor, ReduceOp op) { return iallreduce(tensor, tensor, op); }
Work Communicator::iallreduce(const Tensor& input, Tensor& output, ReduceOp op) {
  return Work(start(state_, allreduce_tensors(state(), input, output, op), "iallreduce"));
}
Work Communicator::ireduce(Tensor& tensor, ReduceOp op, int root) {
  return Work(start(state_, reduce_tensors(state(), tensor, op, root), "ireduce"));
}
Work Communicator::ibroadcast(Tensor& tensor, int root) {
  return Work(start(state_, broadcast_tensors(state(), tensor, root), "ibroadcast"));
}
Work Communicator::iallgather(const Tensor& input, Tensor& output) {
  return Work(start(state_, allgather_tensors(state(), input, output), "iallgather"));
}
Work Communicator::ireduce_scatter(const Tensor& input, Tensor& output, ReduceOp op) {
  return Work(start(state_, reduce_scatter_tensors(state(), input, output, op), "ireduce_scatter"));
}
Work Communicator::igather(const Tensor& input, Tensor& output, int root) {
  return Work(start(state_, gather_tensors(state(), input, output, root), "igather"));
}
Work Communicator::iscatter(const Tensor& input, Tensor& output, int root) {
  return Work(start(state_, scatter_tensors(state(), input, output, root), "iscatter"));
}
Work Communicator::ialltoall(const Tensor& input, Tensor& output) {
  return Work(start(state_, alltoall_tensors(state(), input, output), "ialltoall"));
}
Work Communicator::ibarrier() { return Work(start(state_, {barrier_call(), Device{}, {}, {}}, "ibarrier")); }

void Communicator::send(const Tensor& tensor, int peer, int tag) {
  auto& c = state();
  check_tensor(tensor, "send", "input");
  check_dtype(tensor.dtype(), "send");
  if (tensor.device().kind == Device::Kind::cpu) return send(tensor.data(), numel(tensor), tensor.dtype(), peer, tag);
  check_peer(c, peer, "send");
  // Behind pending GPU calls: they may be opening the backend this one uses.
  in_call_order(c, "send", [state = state_, tensor, peer] {
    p2p_backend(*state, tensor.device(), "send")
        .send(tensor.data(), numel(tensor), tensor.dtype(), peer, cuda::current_stream());
  });
}

void Communicator::recv(Tensor& tensor, int peer, int tag) {
  auto& c = state();
  check_tensor(tensor, "recv", "output");
  check_dtype(tensor.dtype(), "recv");
  if (tensor.device().kind == Device::Kind::cpu) return recv(tensor.data(), numel(tensor), tensor.dtype(), peer, tag);
  check_peer(c, peer, "recv");
  in_call_order(c, "recv", [state = state_, tensor, peer] {
    p2p_backend(*state, tensor.device(), "recv")
        .recv(tensor.data(), numel(tensor), tensor.dtype(), peer, cuda::current_stream());
  });
}

std::vector<AlgorithmRule> Communicator::algorithm_table() { return detail::describe_algorithm_table(detail::comm_config()); }

}  // namespace nodal
