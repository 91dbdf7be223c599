// Each call: check this rank's tensors the way torch's own backends do, stage what is not
// contiguous, run nodal's raw-buffer collective, and return a finished Work holding the outputs
// (or, for a large allreduce with NODAL_TORCH_ASYNC=1, a pending one: work.hpp).
#include <nodal/torch/process_group_nodal.hpp>

#include <nodal/torch/arena_allocator.hpp>

#include "p2p_lanes.hpp"
#include "tensor_bridge.hpp"
#include "work.hpp"

#include <nodal/context.hpp>
#include <nodal/errors.hpp>

#include <nodal/detail/posix.hpp>

#include <ATen/ATen.h>
#include <ATen/DLConvertor.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <mutex>
#include <numeric>

namespace nodal::torch_backend {
namespace {

/// Runs `body` (which returns the call's outputs) and wraps them in a finished Work; nodal's
/// errors become c10::Error (RuntimeError in Python) that name the call and the error's kind.
template <class Body>
c10::intrusive_ptr<c10d::Work> run(const Communicator& comm, c10d::OpType op, const char* call, Body body) {
  try {
    return finished(comm.rank(), op, body());
  } catch (...) {
    std::rethrow_exception(torch_error(std::current_exception(), call));
  }
}

/// Whether an allreduce of `t` runs on the communicator's progress thread (PendingWork): with
/// NODAL_TORCH_ASYNC=1, from 1 MiB (where the thread hop is small next to the call), contiguous,
/// of a dtype DLPack 0.6 carries (torch 1.13's has no bool). Off by default: on the 2-core VM, 2
/// ranks leave no core to overlap with (DDP step 72.1 vs 72.3 ms) and a blocking 64 MiB
/// all_reduce pays 1.7 ms for the hop (bench/results/2026-11-25-torch-backend.md).
bool on_progress_thread(const at::Tensor& t) {
  static const bool enabled = detail::getenv_or_empty("NODAL_TORCH_ASYNC") == "1";
  return enabled && t.nbytes() >= (1u << 20) && t.is_contiguous() && t.scalar_type() != at::kBool &&
         nodal_dtype(t.scalar_type()).has_value();
}

/// A send's or recv's peer: another rank of the group (checked here, before a lane is made for it).
void check_peer(const Communicator& comm, int peer, const char* call) {
  TORCH_CHECK(peer >= 0 && peer < comm.world_size() && peer != comm.rank(), "nodal: ", call, ": peer ", peer,
              " is not another rank of the group (size ", comm.world_size(), ", this rank ", comm.rank(), ")");
}

at::Tensor& single(std::vector<at::Tensor>& tensors, const char* call) {
  TORCH_CHECK(tensors.size() == 1, "nodal: ", call, " takes one tensor per process, got ", tensors.size());
  check_cpu_dense(tensors[0], call, "");
  return tensors[0];
}

int root_of(const Communicator& comm, std::int64_t root, std::int64_t root_tensor, const char* call) {
  TORCH_CHECK(root >= 0 && root < comm.world_size(), "nodal: ", call, ": root ", root, " is not a rank of the group (size ",
              comm.world_size(), ")");
  TORCH_CHECK(root_tensor == 0, "nodal: ", call, ": rootTensor ", root_tensor, " (one tensor per process: 0)");
  return static_cast<int>(root);
}

/// A list of world_size tensors each with `numel` elements of `dtype` (allgather's outputs, ...).
void check_list(const std::vector<at::Tensor>& list, const Communicator& comm, std::int64_t numel,
                at::ScalarType dtype, const char* call, const char* which) {
  TORCH_CHECK(static_cast<int>(list.size()) == comm.world_size(), "nodal: ", call, ": the ", which, " list holds ",
              list.size(), " tensors, expected one per rank (", comm.world_size(), ")");
  for (const auto& t : list) {
    check_cpu_dense(t, call, which);
    TORCH_CHECK(t.numel() == numel, "nodal: ", call, ": a tensor of the ", which, " list has ", t.numel(),
                " elements, expected ", numel);
    TORCH_CHECK(t.scalar_type() == dtype, "nodal: ", call, ": a tensor of the ", which, " list is ", t.scalar_type(),
                ", expected ", dtype);
  }
}

void check_same_dtype(const at::Tensor& a, const at::Tensor& b, const char* call) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "nodal: ", call, ": input dtype ", a.scalar_type(),
              " and output dtype ", b.scalar_type(), " differ");
}

std::vector<std::size_t> numels(const std::vector<at::Tensor>& tensors) {
  std::vector<std::size_t> counts;
  for (const auto& t : tensors) counts.push_back(static_cast<std::size_t>(t.numel()));
  return counts;
}

/// torch's split sizes (rows of dim 0; empty: equal) as element counts of `t`.
std::vector<std::size_t> split_counts(const at::Tensor& t, const std::vector<std::int64_t>& splits, int n,
                                      const char* which) {
  TORCH_CHECK(t.dim() >= 1 || splits.empty(), "nodal: alltoall_base: the ", which, " tensor has no dim 0 to split");
  const std::int64_t rows = t.dim() >= 1 ? t.size(0) : t.numel();
  const std::int64_t row_elements = t.dim() >= 1 && rows > 0 ? t.numel() / rows : 1;
  std::vector<std::size_t> counts;
  if (splits.empty()) {
    TORCH_CHECK(rows % n == 0, "nodal: alltoall_base: the ", which, " tensor's ", rows, " rows do not split into ", n,
                " equal parts");
    counts.assign(static_cast<std::size_t>(n), static_cast<std::size_t>(rows / n * row_elements));
    return counts;
  }
  TORCH_CHECK(static_cast<int>(splits.size()) == n, "nodal: alltoall_base: ", splits.size(), " ", which,
              " split sizes for ", n, " ranks");
  std::int64_t total = 0;
  for (auto s : splits) {
    TORCH_CHECK(s >= 0, "nodal: alltoall_base: a negative ", which, " split size (", s, ")");
    total += s;
    counts.push_back(static_cast<std::size_t>(s * row_elements));
  }
  TORCH_CHECK(total == rows, "nodal: alltoall_base: the ", which, " split sizes add up to ", total, ", but the tensor has ",
              rows, " rows");
  return counts;
}

}  // namespace

c10::intrusive_ptr<ProcessGroupNodal> ProcessGroupNodal::create(int group_rank, int group_size,
                                                                const std::vector<std::int64_t>& global_ranks_in_group,
                                                                const std::string& group_id) {
  Communicator world;
  try {
    world = nodal::init().world();
  } catch (...) {
    std::rethrow_exception(torch_error(std::current_exception(), "joining the job"));
  }
  if (global_ranks_in_group.empty()) {
    TORCH_CHECK(group_size == world.world_size() && group_rank == world.rank(), "nodal: torch's default group is rank ",
                group_rank, " of ", group_size, ", but this process is rank ", world.rank(), " of ", world.world_size(),
                " in its nodal job: the nodal backend runs in ranks started by nodalrun, with torch's RANK and "
                "WORLD_SIZE left as nodalrun sets them");
    // Once per process, for the default group: a later new_group must not undo a script's own
    // stop_arena_allocator() or min_bytes.
    static std::once_flag arena_allocator_from_env;
    std::call_once(arena_allocator_from_env, use_arena_allocator_from_env);
    return c10::make_intrusive<ProcessGroupNodal>(world);
  }
  TORCH_CHECK(static_cast<int>(global_ranks_in_group.size()) == group_size, "nodal: a group of size ", group_size,
              " with ", global_ranks_in_group.size(), " global ranks");
  std::vector<int> ranks;
  for (auto r : global_ranks_in_group) ranks.push_back(static_cast<int>(r));
  TORCH_CHECK(group_rank >= 0 && group_rank < group_size && ranks[static_cast<std::size_t>(group_rank)] == world.rank(),
              "nodal: group rank ", group_rank, " is not this process (rank ", world.rank(), " of the job)");
  try {
    return c10::make_intrusive<ProcessGroupNodal>(world.create_group(ranks, group_id));
  } catch (...) {
    std::rethrow_exception(torch_error(std::current_exception(), "new_group"));
  }
}

ProcessGroupNodal::ProcessGroupNodal(Communicator comm)
    : BackendBase(comm.rank(), comm.world_size()),
      comm_(std::move(comm)),
      lanes_(std::make_unique<P2PLanes>(comm_.rank())) {}

ProcessGroupNodal::~ProcessGroupNodal() = default;

c10::intrusive_ptr<c10d::Work> ProcessGroupNodal::broadcast(std::vector<at::Tensor>& tensors,
                                                            const c10d::BroadcastOptions& opts) {
  return run(comm_, c10d::OpType::BROADCAST, "broadcast", [&]() -> std::vector<at::Tensor> {
    auto& t = single(tensors, "broadcast");
    const int root = root_of(comm_, opts.rootRank, opts.rootTensor, "broadcast");
    Staged s(t, comm_.rank() == root);
    const Buffer b = buffer_of(s.tensor(), false, "broadcast");
    comm_.broadcast(b.data, b.count, b.dtype, root);
    s.commit();
    return tensors;
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNodal::allreduce(std::vector<at::Tensor>& tensors,
                                                            const c10d::AllreduceOptions& opts) {
  if (tensors.size() == 1 && on_progress_thread(tensors[0])) {
    try {
      auto& t = single(tensors, "allreduce");
      const ReduceOp op = reduce_op_of(opts.reduceOp, "allreduce");
      Tensor view = Tensor::from_dlpack(at::toDLPack(t));  // nodal's view of the same bytes
      return pending(comm_.rank(), c10d::OpType::ALLREDUCE, "allreduce", comm_.iallreduce(view, op), tensors);
    } catch (...) {
      std::rethrow_exception(torch_error(std::current_exception(), "allreduce"));
    }
  }
  return run(comm_, c10d::OpType::ALLREDUCE, "allreduce", [&]() -> std::vector<at::Tensor> {
    auto& t = single(tensors, "allreduce");
    const ReduceOp op = reduce_op_of(opts.reduceOp, "allreduce");
    Staged s(t, true);
    const Buffer b = buffer_of(s.tensor(), true, "allreduce");
    comm_.allreduce(b.data, b.data, b.count, b.dtype, op);
    s.commit();
    return tensors;
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNodal::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                      const c10d::AllreduceCoalescedOptions& opts) {
  return run(comm_, c10d::OpType::ALLREDUCE_COALESCED, "allreduce_coalesced", [&]() -> std::vector<at::Tensor> {
    TORCH_CHECK(!tensors.empty(), "nodal: allreduce_coalesced: no tensors");
    const ReduceOp op = reduce_op_of(opts.reduceOp, "allreduce_coalesced");
    at::Tensor flat = flatten(tensors, tensors[0].scalar_type(), "allreduce_coalesced");
    const Buffer b = buffer_of(flat, true, "allreduce_coalesced");
    comm_.allreduce(b.data, b.data, b.count, b.dtype, op);
    unflatten(flat, tensors);
    return tensors;
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNodal::reduce(std::vector<at::Tensor>& tensors,
                                                         const c10d::ReduceOptions& opts) {
  return run(comm_, c10d::OpType::REDUCE, "reduce", [&]() -> std::vector<at::Tensor> {
    auto& t = single(tensors, "reduce");
    const int root = root_of(comm_, opts.rootRank, opts.rootTensor, "reduce");
    const ReduceOp op = reduce_op_of(opts.reduceOp, "reduce");
    Staged s(t, true);
    const Buffer b = buffer_of(s.tensor(), true, "reduce");
    comm_.reduce(b.data, comm_.rank() == root ? b.data : nullptr, b.count, b.dtype, op, root);
    if (comm_.rank() == root) s.commit();
    return tensors;
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNodal::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllgatherOptions&) {
  return run(comm_, c10d::OpType::ALLGATHER, "allgather", [&]() -> std::vector<at::Tensor> {
    auto& in = single(inputs, "allgather");
    TORCH_CHECK(outputs.size() == 1, "nodal: allgather takes one output list per process, got ", outputs.size());
    check_list(outputs[0], comm_, in.numel(), in.scalar_type(), "allgather", "output");
    const at::Tensor input = in.contiguous();
    at::Tensor flat = at::empty({comm_.world_size() * in.numel()}, in.options().memory_format(at::MemoryFormat::Contiguous));
    const Buffer bi = buffer_of(input, false, "allgather");
    comm_.allgather(bi.data, flat.data_ptr(), bi.count, bi.dtype);
    unflatten(flat, outputs[0]);
    return outputs[0];
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNodal::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                  const c10d::AllgatherOptions&) {
  return run(comm_, c10d::OpType::_ALLGATHER_BASE, "_allgather_base", [&]() -> std::vector<at::Tensor> {
    check_cpu_dense(input, "_allgather_base", "input");
    check_cpu_dense(output, "_allgather_base", "output");
    check_same_dtype(input, output, "_allgather_base");
    TORCH_CHECK(output.numel() == comm_.world_size() * input.numel(), "nodal: _allgather_base: the output has ",
                output.numel(), " elements, expected world_size x the input's (", comm_.world_size() * input.numel(), ")");
    const at::Tensor in = input.contiguous();
    Staged out(output, false);
    const Buffer bi = buffer_of(in, false, "_allgather_base");
    comm_.allgather(bi.data, out.tensor().data_ptr(), bi.count, bi.dtype);
    out.commit();
    return {output};
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNodal::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                         std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  return run(comm_, c10d::OpType::GATHER, "gather", [&]() -> std::vector<at::Tensor> {
    auto& in = single(inputs, "gather");
    const int root = root_of(comm_, opts.rootRank, 0, "gather");
    const bool is_root = comm_.rank() == root;
    if (is_root) {
      TORCH_CHECK(outputs.size() == 1, "nodal: gather: the root takes one output list, got ", outputs.size());
      check_list(outputs[0], comm_, in.numel(), in.scalar_type(), "gather", "output");
    } else {
      TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                  "nodal: gather: only the root passes output tensors");
    }
    const at::Tensor input = in.contiguous();
    at::Tensor flat;
    if (is_root) flat = at::empty({comm_.world_size() * in.numel()}, in.options().memory_format(at::MemoryFormat::Contiguous));
    const Buffer bi = buffer_of(input, false, "gather");
    comm_.gather(bi.data, is_root ? flat.data_ptr() : nullptr, bi.count, bi.dtype, root);
    if (!is_root) return {};
    unflatten(flat, outputs[0]);
    return outputs[0];
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNodal::scatter(std::vector<at::Tensor>& outputs,
                                                          std::vector<std::vector<at::Tensor>>& inputs,
                                                          const c10d::ScatterOptions& opts) {
  return run(comm_, c10d::OpType::SCATTER, "scatter", [&]() -> std::vector<at::Tensor> {
    auto& out = single(outputs, "scatter");
    const int root = root_of(comm_, opts.rootRank, 0, "scatter");
    const bool is_root = comm_.rank() == root;
    at::Tensor flat;
    if (is_root) {
      TORCH_CHECK(inputs.size() == 1, "nodal: scatter: the root takes one input list, got ", inputs.size());
      check_list(inputs[0], comm_, out.numel(), out.scalar_type(), "scatter", "input");
      flat = flatten(inputs[0], out.scalar_type(), "scatter");
    } else {
      TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
                  "nodal: scatter: only the root passes input tensors");
    }
    Staged s(out, false);
    const Buffer bo = buffer_of(s.tensor(), false, "scatter");
    comm_.scatter(is_root ? flat.data_ptr() : nullptr, bo.data, bo.count, bo.dtype, root);
    s.commit();
    return outputs;
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNodal::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                 std::vector<std::vector<at::Tensor>>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) {
  return run(comm_, c10d::OpType::REDUCE_SCATTER, "reduce_scatter", [&]() -> std::vector<at::Tensor> {
    auto& out = single(outputs, "reduce_scatter");
    TORCH_CHECK(inputs.size() == 1, "nodal: reduce_scatter takes one input list per process, got ", inputs.size());
    const ReduceOp op = reduce_op_of(opts.reduceOp, "reduce_scatter");
    auto& list = inputs[0];
    TORCH_CHECK(static_cast<int>(list.size()) == comm_.world_size(), "nodal: reduce_scatter: the input list holds ",
                list.size(), " tensors, expected one per rank (", comm_.world_size(), ")");
    TORCH_CHECK(list[static_cast<std::size_t>(comm_.rank())].numel() == out.numel(), "nodal: reduce_scatter: the output has ",
                out.numel(), " elements, but this rank's input block has ", list[static_cast<std::size_t>(comm_.rank())].numel());
    at::Tensor flat = flatten(list, out.scalar_type(), "reduce_scatter");
    Staged s(out, false);
    const Buffer bi = buffer_of(flat, true, "reduce_scatter");
    const auto counts = numels(list);
    if (std::all_of(counts.begin(), counts.end(), [&](std::size_t c) { return c == counts[0]; })) {
      comm_.reduce_scatter(bi.data, s.tensor().data_ptr(), counts[0], bi.dtype, op);
    } else {
      comm_.reduce_scatterv(bi.data, s.tensor().data_ptr(), counts, bi.dtype, op);
    }
    s.commit();
    return outputs;
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNodal::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                       const c10d::ReduceScatterOptions& opts) {
  return run(comm_, c10d::OpType::_REDUCE_SCATTER_BASE, "_reduce_scatter_base", [&]() -> std::vector<at::Tensor> {
    check_cpu_dense(input, "_reduce_scatter_base", "input");
    check_cpu_dense(output, "_reduce_scatter_base", "output");
    check_same_dtype(input, output, "_reduce_scatter_base");
    const ReduceOp op = reduce_op_of(opts.reduceOp, "_reduce_scatter_base");
    TORCH_CHECK(input.numel() == comm_.world_size() * output.numel(), "nodal: _reduce_scatter_base: the input has ",
                input.numel(), " elements, expected world_size x the output's (", comm_.world_size() * output.numel(), ")");
    const at::Tensor in = input.contiguous();
    Staged out(output, false);
    const Buffer bo = buffer_of(out.tensor(), true, "_reduce_scatter_base");
    comm_.reduce_scatter(in.data_ptr(), bo.data, bo.count, bo.dtype, op);
    out.commit();
    return {output};
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNodal::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                std::vector<std::int64_t>& output_split_sizes,
                                                                std::vector<std::int64_t>& input_split_sizes,
                                                                const c10d::AllToAllOptions&) {
  return run(comm_, c10d::OpType::ALLTOALL_BASE, "alltoall_base", [&]() -> std::vector<at::Tensor> {
    check_cpu_dense(input, "alltoall_base", "input");
    check_cpu_dense(output, "alltoall_base", "output");
    check_same_dtype(input, output, "alltoall_base");
    const int n = comm_.world_size();
    const at::Tensor in = input.contiguous();
    Staged out(output, false);
    const Buffer bi = buffer_of(in, false, "alltoall_base");
    const Buffer bo = buffer_of(out.tensor(), false, "alltoall_base");
    // Counts in elements of bi.dtype (bytes when the dtype moves as bytes).
    const std::size_t scale = count_scale(in.scalar_type());
    auto send = split_counts(in, input_split_sizes, n, "input");
    auto receive = split_counts(output, output_split_sizes, n, "output");
    for (auto& c : send) c *= scale;
    for (auto& c : receive) c *= scale;
    if (input_split_sizes.empty() && output_split_sizes.empty()) {
      TORCH_CHECK(bi.count == bo.count, "nodal: alltoall_base: input and output sizes differ (", in.numel(), " and ",
                  output.numel(), " elements)");
      comm_.alltoall(bi.data, bo.data, send[0], bi.dtype);
    } else {
      comm_.alltoallv(bi.data, send, bo.data, receive, bi.dtype);
    }
    out.commit();
    return {output};
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNodal::alltoall(std::vector<at::Tensor>& outputs,
                                                           std::vector<at::Tensor>& inputs, const c10d::AllToAllOptions&) {
  return run(comm_, c10d::OpType::ALLTOALL, "alltoall", [&]() -> std::vector<at::Tensor> {
    const int n = comm_.world_size();
    TORCH_CHECK(static_cast<int>(inputs.size()) == n && static_cast<int>(outputs.size()) == n, "nodal: alltoall takes ",
                n, " input and ", n, " output tensors, got ", inputs.size(), " and ", outputs.size());
    const auto dtype = inputs[0].scalar_type();
    at::Tensor flat_in = flatten(inputs, dtype, "alltoall");
    for (const auto& t : outputs) {
      check_cpu_dense(t, "alltoall", "output");
      check_same_dtype(inputs[0], t, "alltoall");
    }
    auto send = numels(inputs), receive = numels(outputs);
    // Only written: allocated, not filled with the outputs' old values.
    at::Tensor flat_out = at::empty({static_cast<std::int64_t>(std::accumulate(receive.begin(), receive.end(), std::size_t{0}))},
                                    inputs[0].options().memory_format(at::MemoryFormat::Contiguous));
    const Buffer bi = buffer_of(flat_in, false, "alltoall");
    const Buffer bo = buffer_of(flat_out, false, "alltoall");
    const std::size_t scale = count_scale(dtype);
    for (auto& c : send) c *= scale;
    for (auto& c : receive) c *= scale;
    comm_.alltoallv(bi.data, send, bo.data, receive, bi.dtype);
    unflatten(flat_out, outputs);
    return outputs;
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNodal::barrier(const c10d::BarrierOptions&) {
  return run(comm_, c10d::OpType::BARRIER, "barrier", [&]() -> std::vector<at::Tensor> {
    comm_.barrier();
    return {};
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNodal::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  try {
    const at::Tensor in = single(tensors, "send").contiguous();
    const Buffer b = buffer_of(in, false, "send");
    check_peer(comm_, dst_rank, "send");
    // `in` rides along: a contiguous copy lives until the message has gone.
    return lanes_->post(
        P2PLanes::Direction::send, dst_rank, c10d::OpType::SEND, "send",
        [comm = comm_, in, b, dst_rank, tag]() mutable { comm.send(b.data, b.count, b.dtype, dst_rank, tag); }, {});
  } catch (...) {
    std::rethrow_exception(torch_error(std::current_exception(), "send"));
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNodal::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  try {
    check_peer(comm_, src_rank, "recv");
    auto staged = std::make_shared<Staged>(single(tensors, "recv"), false);
    const Buffer b = buffer_of(staged->tensor(), false, "recv");
    return lanes_->post(
        P2PLanes::Direction::recv, src_rank, c10d::OpType::RECV, "recv",
        [comm = comm_, staged, b, src_rank, tag]() mutable {
          comm.recv(b.data, b.count, b.dtype, src_rank, tag);
          staged->commit();
        },
        tensors);
  } catch (...) {
    std::rethrow_exception(torch_error(std::current_exception(), "recv"));
  }
}

}  // namespace nodal::torch_backend
