// nodal::torch_backend::ProcessGroupNodal: a torch.distributed (c10d) process group whose
// collectives are nodal's (nodal::Communicator over the job's shared memory), for torch on CPU:
// `import nodal_torch; torch.distributed.init_process_group("nodal")` under nodalrun, or from
// libtorch, `ProcessGroupNodal::create(...)` then `pg->allreduce(tensors)->wait()`.
// The shape follows torch's own backends (ProcessGroupGloo, ProcessGroupMPI) and torch-ccl's
// ProcessGroupCCL; the research behind it is ../shared/research/torch-c10d-backend.md.
//
// What every call does and refuses:
// - One CPU tensor per call (per list where torch passes lists of lists), dense (strided); a
//   cuda, sparse or meta tensor is a c10::Error naming it. Non-contiguous tensors are staged
//   through a contiguous copy and copied back. Tensors in nodal's arena (nodal_torch.empty_shared,
//   or any torch tensor over arena memory) are read and written in place by the in_place path.
// - dtypes: bool, uint8, int8, int32, int64, float16, bfloat16, float32, float64 for every call.
//   Others (int16, complex, ...) move as bytes in the calls that only copy (broadcast, allgather,
//   gather, scatter, alltoall, send, recv); reductions refuse them.
// - ReduceOp: SUM, AVG, PRODUCT, MIN, MAX (nodal's sum, avg, prod, min, max; integer AVG rounds
//   toward zero, bool AVG is refused). BAND, BOR, BXOR and PREMUL_SUM are refused.
// - Results are nodal's: bitwise identical on every rank and from run to run, contributions
//   combined in rank order (gloo's order too for 2 ranks; its ring differs for 3 and more).
// - With NODAL_TORCH_ASYNC=1, an allreduce of 1 MiB or more (contiguous, not bool) runs on the
//   communicator's progress thread (Communicator::iallreduce) and returns a pending Work whose
//   future the progress thread completes with the tensor: DDP's backward pass goes on computing
//   while a gradient bucket is reduced, as with torch's own backends. Worth it where cores are
//   spare; off by default (with 2 ranks on 2 cores it gained nothing and cost the hop).
//   Every other collective runs to completion on the calling thread, after any pending one (calls keep
//   their order), and returns a finished Work whose future holds the output tensors (what DDP's
//   comm hooks read). A mismatched call across ranks (count, dtype, op, root, kind) raises on
//   every rank with nodal's UsageError text; a dead peer raises PeerFailure's text within 100 ms
//   (from the call, or from a pending Work's wait() and future). Both reach Python as RuntimeError.
// - The process group's timeout is not applied to calls: a peer that dies ends them with
//   PeerFailure; a peer that never makes its call is what nodalrun's --stall-timeout names.
// - send/recv return a pending Work at once (torch's isend/irecv) and run on a thread of the
//   group per direction and peer, each in call order (p2p_lanes.hpp): nodal's send is a
//   rendezvous (MPI_Ssend), so on the caller's thread an isend followed by a recv on both sides
//   of a pair would deadlock. Messages between two ranks are matched in order, and the recv must
//   name the send's tag (a differing tag: UsageError on both sides, from the Work's wait()). A
//   peer outside the group is a c10::Error at the call. Destroying the group waits for the sends
//   and receives posted (one nobody answers keeps it waiting: nodalrun's --stall-timeout).
#pragma once

#include <nodal/communicator.hpp>
#include <nodal/torch/backend_base.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace nodal::torch_backend {

class P2PLanes;

class ProcessGroupNodal final : public BackendBase {
 public:
  /// The process group of `group_rank` among `group_size` ranks, for torch's creator function.
  /// `global_ranks_in_group`: the job ranks of the group in group-rank order, as torch passes them
  /// (empty for the default group, which is nodal's world: `group_size` must be the job's
  /// world_size and `group_rank` this rank, or c10::Error says how they differ). A subgroup is
  /// made by its members alone (Communicator::create_group, tagged with `group_id`, torch's group
  /// name), as torch calls the creator in the members only. The first default group installs the
  /// arena allocator when NODAL_TORCH_ARENA_MIN_BYTES is set (arena_allocator.hpp). Throws
  /// c10::Error outside a nodal job.
  static c10::intrusive_ptr<ProcessGroupNodal> create(int group_rank, int group_size,
                                                       const std::vector<std::int64_t>& global_ranks_in_group,
                                                       const std::string& group_id = "");

  explicit ProcessGroupNodal(Communicator comm);
  ~ProcessGroupNodal() override;

  const std::string getBackendName() const override { return "nodal"; }
  /// The communicator every call goes to.
  const Communicator& communicator() const noexcept { return comm_; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  /// Every tensor of one dtype: reduced as one flat buffer, in one call.
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts = c10d::AllreduceCoalescedOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts = c10d::ReduceOptions()) override;
  /// outputs[0] holds world_size tensors shaped like inputs[0].
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  /// output holds world_size x input's numel elements.
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts = c10d::GatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts = c10d::ScatterOptions()) override;
  /// inputs[0] holds world_size tensors shaped like outputs[0] (their numels may differ per rank
  /// block: reduce_scatterv).
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  /// input holds world_size x output's numel elements.
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  /// torch's all_to_all_single: split sizes count rows of dim 0 (empty: equal blocks).
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<std::int64_t>& output_split_sizes,
                                               std::vector<std::int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  /// torch's all_to_all: tensor j of inputs goes to rank j; any sizes.
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;
  /// send and recv return at once (torch's isend/irecv; dist.send waits on the Work): they run on
  /// the group's threads per direction and peer (p2p_lanes.hpp), so two ranks may isend to each
  /// other before they recv. `tag`: the recv must name the send's tag; messages between two ranks are
  /// matched in order (Communicator::send: a differing tag is a UsageError on both sides).
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) override;

 private:
  Communicator comm_;
  /// After comm_: destroyed first, once what they run is done.
  std::unique_ptr<P2PLanes> lanes_;
};

}  // namespace nodal::torch_backend
