// nodal::Communicator: collectives and point-to-point messages among the ranks of a job, over the
// job's shared arena (DESIGN.md "Collectives"). The interface follows MPI and torch.distributed
// (allreduce, reduce, broadcast, allgather, reduce_scatter, gather, scatter, alltoall, barrier,
// send/recv; ops sum, prod, min, max, avg); the shared-memory algorithms follow the intra-node
// paths of NCCL, Open MPI's coll/sm and MPICH's shm collectives (per-rank slots, flags on their own
// cache lines, sequence numbers, reduce-scatter + all-gather in pipelined chunks).
//
// Rules every call follows:
// - Collective calls are made by every rank of the communicator, in the same order, with the same
//   count, dtype, op and root. A mismatch is detected and throws UsageError on every rank (never
//   a hang or a wrong answer); the communicator stays usable afterwards. One exception in timing:
//   small broadcast, scatter, gather and reduce (<= 16 KiB of slot data per rank: a scatter root's
//   is every block but on 2 ranks, where it is one; on 2-4 ranks outnumbering
//   cores broadcast and scatter up to 64 KiB in the root's slot, on 4 reduce up to 32 KiB; or
//   NODAL_SMALL_MAX_BYTES) are eager, as in MPI: their senders (the root of broadcast and scatter,
//   the others of gather and reduce) post and return, up to 63 calls ahead of the receivers with
//   the default small path (31 from 17 ranks, 15 from 33), so a sender's UsageError for a
//   mismatched one comes from its next collective call.
// - Results are bitwise identical on every rank and from run to run: contributions are combined
//   in rank order (0, 1, ..., n-1) whatever the algorithm; f16 and bf16 are accumulated in f32 and
//   rounded once (to nearest even). Integer sum and prod wrap around (two's complement); integer
//   avg is the sum (in 64 bits) divided by world_size, rounded toward zero. bool: sum and max are
//   logical or, prod and min logical and; avg of bool is a UsageError.
// - Buffers hold `count` contiguous elements of `dtype` unless a call says otherwise. In-place:
//   pass the same pointer (or tensor) as input and output. Buffers of the same call must not
//   overlap otherwise.
// - A dead peer (nodalrun has declared the job failed) makes every pending and later call throw
//   PeerFailure within 100 ms. Waiting goes through the runtime's one waiting helper (spin, then
//   yield when ranks outnumber cores, then futex).
// - A rank whose call fails part-way with an error other than UsageError (a cross-memory copy the
//   kernel refuses, no room in the arena, a GPU error) gets that error, and the communicator is
//   broken: its peers' pending calls that wait for it (on NCCL: any call a peer is in) and every
//   later call on it, on every member, throw PeerFailure naming that rank and its error, even if
//   the rank catches its error and goes on
//   (ULFM's MPI_Comm_revoke, done without being asked). On cpu buffers a call that throws returns
//   no buffer a peer still reads or writes, and a call that returns normally has the right result.
// - A Communicator is a cheap handle (copies share one state); use it from one thread at a time
//   (its non-blocking calls run on a thread of its own: see "Non-blocking collectives"), except
//   that send and recv on cpu buffers may run on other threads at the same time as the
//   collectives and as each other, as long as no two threads send to one peer, or receive from
//   one peer, at once (how a torch isend and irecv go on while the caller goes on).
//
// Algorithms, picked per call from size and world size (Communicator::algorithm_table()):
//   small      every rank copies its input into its slot, every rank reduces all slots itself
//              (one cache-line hand-off for tiny messages);
//   pipelined  inputs staged in chunks, rank r reduces block r of each chunk, all ranks gather the
//              reduced blocks (reduce-scatter + all-gather), chunks pipelined through a ring;
//   in_place   chosen when every rank's buffers are in the job arena (Tensor::empty_shared,
//              share_memory()): peers' buffers are read where they are (single copy); allreduce's
//              is one pass, each block's owner reducing it and writing it into every output.
//   cma        copies (broadcast, allgather, gather, scatter, alltoall) of >= 16 KiB per rank from
//              private buffers, below 1 MiB (broadcast 2 MiB; allgather, gather, alltoall: 512 KiB; on Intel
//              processors allgather and alltoall 16 MiB, broadcast, gather and scatter at
//              every size) unless ranks outnumber cores (NODAL_CROWDED): one
//              process_vm_readv per peer (cross-memory attach, single copy, as Open MPI and MPICH
//              do), where the kernel allows it (Yama's ptrace_scope 0, or 1: each rank then lets
//              any process of its user ptrace it, PR_SET_PTRACER_ANY, as Open MPI does) and
//              NODAL_CMA is not 0 (which also leaves the ptracer setting alone);
//              otherwise pipelined. gather's peers instead write their blocks into the root's
//              output (process_vm_writev) and return, while the root copies its own: the copies
//              run on every core at once (4 ranks on 2 cores: 1.28-2.25x the reading root's
//              speed). broadcast's root writes the last block of n into each receiver's output
//              meanwhile, the receivers reading the rest (2 ranks: 2.0-3.3x Open MPI 4.1.4 at
//              1-4 MiB on Intel Xeon; 4 ranks on 2 cores 1.3-2x the speed of reading it all). Also reduce while (world_size - 1) x size <= 256 KiB and every rank has a
//              core (the root reads the inputs), and allreduce on 2 ranks from
//              1 MiB below 32 MiB (in place, input == output, up to 64 MiB; from 8 MiB in place each
//              rank also writes its reduced block into the peer's output with process_vm_writev).
//   linear     reduce of private buffers: the peers stage their inputs 16 KiB at a time, the root
//              folds each segment as it comes (Open MPI's basic linear reduce, segmented); on 2
//              ranks with a core each up to 8 MiB where cma does not take it, and where ranks
//              outnumber cores while (world_size - 1) x size <= 256 KiB.
// Environment overrides (read once per process; every rank must see the same values):
//   NODAL_ALLREDUCE_ALGO=auto|small|pipelined|in_place   allreduce's algorithm; NODAL_ALGO the
//                                 same for every collective. A forced algorithm applies where it
//                                 can: small only up to NODAL_SMALL_MAX_BYTES, in_place only when
//                                 the buffers are in the arena; elsewhere the automatic choice.
//   NODAL_CMA=0                   never use cross-memory attach
//   NODAL_CMA_MIN_BYTES=N         smallest copy (bytes per rank) that takes cma (default 16 KiB)
//   NODAL_SMALL_MAX_BYTES=N       largest slot contribution (bytes per rank: a message, or
//                                 world_size blocks for alltoall, reduce_scatter and a scatter
//                                 root of 3 or more ranks) that takes the small path,
//                                 for every op (default 16 KiB; broadcast and scatter 64 KiB on
//                                 2-4 ranks outnumbering cores, reduce 32 KiB on 4; 0: never)
//   NODAL_CHUNK_BYTES=N           pipeline chunk: most bytes per step, all blocks together (default
//                                 1 MiB, at least 4096); a message of one chunk from 256 KiB takes
//                                 two steps while every rank has a core
//   NODAL_REDUCE_ISA=auto|avx2|baseline  the reductions' instruction set: AVX2 where the CPU has
//                                 it (x86-64 builds), else the baseline; the bits are the same
// Sizes accept suffixes (64K, 1M, 2Mi, 1MiB: powers of 1024). The per-rank slots live in the
// arena (64 slots of 32 B + 16 KiB per rank up to 16 ranks, about 1 MiB; 64 KiB slots, about
// 4 MiB, on 2-4 ranks outnumbering cores; src/comm_state.hpp), and from the first pipelined or
// linear call a staging ring (4 * chunk per rank) per communicator, for the life of the job.
#pragma once

#include <nodal/context.hpp>
#include <nodal/tensor.hpp>
#include <nodal/work.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace nodal {

/// Reduction operators (MPI_SUM, ..., torch's ReduceOp.AVG).
enum class ReduceOp : std::uint8_t { sum, prod, min, max, avg };

/// "sum", "prod", "min", "max", "avg".
const char* reduce_op_name(ReduceOp op) noexcept;

/// One row of the algorithm table: calls of at most `max_bytes` (per rank input) take `algorithm`.
struct AlgorithmRule {
  std::string op;         ///< "allreduce", "broadcast", ...
  std::size_t max_bytes;  ///< SIZE_MAX for "any larger size"
  std::string algorithm;  ///< "small", "pipelined", "in_place"
};

namespace detail {
struct CommState;
}

class Communicator {
 public:
  /// An invalid communicator (what split() returns to ranks that pass a negative color).
  Communicator() = default;

  bool valid() const noexcept { return state_ != nullptr; }
  /// This process's rank in the communicator, 0 .. world_size()-1.
  int rank() const;
  int world_size() const;
  /// The job's rank (Context::rank) of communicator rank `rank`.
  int global_rank(int rank) const;

  /// Collective. Ranks passing the same `color` (>= 0) form a new communicator, ordered by
  /// (key, this communicator's rank); ranks passing a negative color get an invalid one
  /// (MPI_Comm_split with MPI_UNDEFINED). Throws ShmError when the arena has no room. In a job
  /// across nodes, a communicator within one node takes the shared-memory path; one that spans
  /// nodes runs its calls as send/recv between its members (the same results, untuned).
  Communicator split(int color, int key) const;
  /// Made by the members alone, not a collective call of this communicator (MPI_Comm_create_group's
  /// semantics; what torch.distributed.new_group needs, whose backend is made in the member ranks
  /// only). `ranks` are ranks of this communicator, distinct, listed in the new communicator's rank
  /// order, this rank among them. Every member passes the same `ranks` and `tag`: the k-th group a
  /// member makes with a given (set of ranks, tag) is the k-th of every other member. Members that
  /// list the same ranks in different orders get UsageError from this call; members whose lists
  /// hold different ranks wait for each other in their first collective call, as in MPI (an
  /// erroneous program: nodalrun's --stall-timeout names it). Throws UsageError for a bad list
  /// (empty, out of range, repeated, without this rank), ShmError when the arena has no room. In
  /// a job across nodes, a group that spans nodes is as with split; its members compare their
  /// lists when they make it (the order check above: a member whose order differs from the
  /// lowest global rank's gets UsageError), so this call then waits for every member.
  Communicator create_group(const std::vector<int>& ranks, std::string_view tag = {}) const;

  // ---- Raw buffers: count elements of dtype at each pointer (count may be 0). ----

  /// Every rank's `output` gets op over every rank's `input`. input == output: in place.
  void allreduce(const void* input, void* output, std::size_t count, DType dtype, ReduceOp op = ReduceOp::sum);
  /// `output` on `root` gets op over every rank's `input`; other ranks' output is not written
  /// (may be nullptr).
  void reduce(const void* input, void* output, std::size_t count, DType dtype, ReduceOp op, int root);
  /// Every rank's `buffer` gets root's `buffer`.
  void broadcast(void* buffer, std::size_t count, DType dtype, int root);
  /// `output` (world_size * count elements) gets every rank's `input` (count elements) in rank
  /// order. input == output + rank * count: in place.
  void allgather(const void* input, void* output, std::size_t count, DType dtype);
  /// `input` holds world_size * count elements; `output` (count elements) gets block `rank` of
  /// op over every rank's input. output == input + rank * count: in place.
  void reduce_scatter(const void* input, void* output, std::size_t count, DType dtype, ReduceOp op = ReduceOp::sum);
  /// `output` on root (world_size * count elements) gets every rank's `input` (count) in rank
  /// order; other ranks' output is not written (may be nullptr).
  void gather(const void* input, void* output, std::size_t count, DType dtype, int root);
  /// Rank r's `output` (count elements) gets block r of root's `input` (world_size * count);
  /// non-root ranks' input is not read (may be nullptr).
  void scatter(const void* input, void* output, std::size_t count, DType dtype, int root);
  /// `input` and `output` hold world_size * count elements: block j of rank r's output is block
  /// r of rank j's input. Not in place (input and output must not overlap).
  void alltoall(const void* input, void* output, std::size_t count, DType dtype);
  // ---- v-variants: per-rank counts (MPI_Allgatherv, ...; torch's split sizes). ----
  // Counts are elements, one per rank of the communicator; blocks are packed back to back in rank
  // order (MPI's displs = the exclusive prefix sums of the counts, as torch packs split sizes).
  // Every rank's counts must agree with the others' (the same counts everywhere they are given,
  // and each rank's own count equal to its entry): checked on every rank, a disagreement is the
  // same UsageError on every rank, and the communicator goes on. Same dtypes, ops and PeerFailure
  // rule as above. CPU buffers only for now (the Tensor forms refuse cuda tensors); the data is
  // staged through the arena (two copies per byte; see src/shm/vector_collectives.hpp); across
  // nodes, each block is padded to the call's largest count (src/internode/across_nodes.cpp).

  /// `output` (sum(counts) elements) gets every rank's `input` (`count` == counts[rank] elements).
  void allgatherv(const void* input, std::size_t count, void* output, const std::vector<std::size_t>& counts,
                  DType dtype);
  /// allgatherv onto `root` only: `counts` and `output` matter on root (others may pass {} and nullptr).
  void gatherv(const void* input, std::size_t count, void* output, const std::vector<std::size_t>& counts, DType dtype,
               int root);
  /// Rank r's `output` (`count` == counts[r] elements) gets block r of root's `input`
  /// (sum(counts) elements); `input` and `counts` matter on root only.
  void scatterv(const void* input, const std::vector<std::size_t>& counts, void* output, std::size_t count,
                DType dtype, int root);
  /// Rank r sends send_counts[q] elements (block q of `input`) to each rank q, and receives
  /// recv_counts[p] elements from each rank p into block p of `output` (torch's all_to_all_single
  /// with input/output split sizes). send_counts[q] on rank p must equal recv_counts[p] on rank q.
  /// Not in place.
  void alltoallv(const void* input, const std::vector<std::size_t>& send_counts, void* output,
                 const std::vector<std::size_t>& recv_counts, DType dtype);
  /// `input` holds sum(counts) elements on every rank; rank r's `output` (counts[r] elements) gets
  /// block r of op over every rank's input (MPI_Reduce_scatter).
  void reduce_scatterv(const void* input, void* output, const std::vector<std::size_t>& counts, DType dtype,
                       ReduceOp op = ReduceOp::sum);

  /// Returns once every rank has called it.
  void barrier();
  /// barrier() on a device: for cuda, also returns only once every rank's work queued on its
  /// cuda::current_stream() before the call has finished (on the GPU path below). Device{}: barrier().
  void barrier(Device device);
  /// Blocks until `peer` has received the message (count elements of dtype) with recv (a
  /// rendezvous, like MPI_Ssend). Messages between two ranks arrive in order. Not part of the
  /// collective call sequence: send/recv may be interleaved with collectives freely.
  /// `tag` (MPI's and torch's message tag, any int) labels the message; the recv must name the
  /// same tag as the send it meets. Matching is in order, not by tag: a recv whose tag differs
  /// from the next message's is a mismatch, not a wait for a later message (that message's
  /// sender is blocked in its rendezvous, so with MPI_Ssend the same program would deadlock).
  /// Mismatched count, dtype or tag: UsageError on both sides, and that direction of the pair
  /// stays unusable (every later send or recv on it throws UsageError at once); other pairs, the
  /// other direction and collectives go on working. In a job across nodes, between any two
  /// ranks with the same rules (the nodes' agents move the messages: launcher/src/multinode/
  /// p2p_relay.hpp). Throws PeerFailure when the job fails while waiting.
  void send(const void* input, std::size_t count, DType dtype, int peer, int tag = 0);
  void recv(void* output, std::size_t count, DType dtype, int peer, int tag = 0);

  // ---- Tensors: contiguous tensors; count and dtype come from the tensor. ----
  // Throws UsageError for a non-contiguous or undefined tensor, when shapes do not fit (outputs of
  // allgather/gather: world_size times the input's numel; reduce_scatter's input: world_size times
  // the output's numel), or when a call's input and output are on different devices.
  //
  // cuda tensors (DESIGN.md "Collectives", GPU path): the same calls, rules and semantics, on the
  // rank's GPU. Every rank's tensors must be on cuda (a cpu call meeting a cuda call is a
  // mismatch: UsageError on every rank), each rank on one device for all of a communicator's GPU
  // calls. The first GPU call gathers every rank's GPU identity and picks the path, the same on
  // every rank: NCCL (ncclAllReduce, ...) when every rank has its own GPU and nodal has NCCL;
  // otherwise CUDA IPC over the job's GPU pool (ranks sharing a GPU, which NCCL refuses;
  // allreduce, reduce, broadcast, allgather, reduce_scatter and barrier only). NODAL_GPU_BACKEND=
  // auto|nccl|cuda_ipc overrides the choice. A call is ordered after the work queued on
  // cuda::current_stream() and returns once its result is in place (the host waits, watching for
  // a dead peer: PeerFailure, never a GPU hang). last_algorithm() says "nccl" or "cuda_ipc".
  // send/recv of cuda tensors need the GPU path set up by an earlier GPU collective (UsageError
  // otherwise) and NCCL. Throws CudaError when the GPU or NCCL fails, or in a build without CUDA.
  // Where the GPU paths differ from the CPU path's results: CUDA IPC folds in rank order like the
  // CPU (bitwise equal, NaN payloads aside); NCCL reduces in its own order, so float sums with 3 or
  // more ranks may differ from the CPU's in the last bits (still identical on every rank), its
  // float min/max drop NaNs (fmin/fmax), and bool takes max/min of bytes (equal to or/and for 0/1).
  // A rank that throws on its own in a GPU call (out of GPU memory, say) leaves its peers waiting
  // until the job fails: let such errors end the rank.

  /// In place: every rank's `tensor` becomes op over every rank's `tensor`.
  void allreduce(Tensor& tensor, ReduceOp op = ReduceOp::sum);
  void allreduce(const Tensor& input, Tensor& output, ReduceOp op = ReduceOp::sum);
  void reduce(Tensor& tensor, ReduceOp op, int root);
  void broadcast(Tensor& tensor, int root);
  void allgather(const Tensor& input, Tensor& output);
  void reduce_scatter(const Tensor& input, Tensor& output, ReduceOp op = ReduceOp::sum);
  void gather(const Tensor& input, Tensor& output, int root);
  void scatter(const Tensor& input, Tensor& output, int root);
  void alltoall(const Tensor& input, Tensor& output);
  /// cpu tensors: as send/recv of a buffer, tags checked. cuda tensors go through NCCL, which has
  /// no tags: `tag` is ignored there, as torch's NCCL backend ignores it.
  void send(const Tensor& tensor, int peer, int tag = 0);
  void recv(Tensor& tensor, int peer, int tag = 0);
  /// The v-variants on contiguous cpu tensors; counts in elements (numel of each block).
  void allgatherv(const Tensor& input, Tensor& output, const std::vector<std::int64_t>& counts);
  void gatherv(const Tensor& input, Tensor& output, const std::vector<std::int64_t>& counts, int root);
  void scatterv(const Tensor& input, Tensor& output, const std::vector<std::int64_t>& counts, int root);
  void alltoallv(const Tensor& input, Tensor& output, const std::vector<std::int64_t>& input_split_sizes,
                 const std::vector<std::int64_t>& output_split_sizes);
  void reduce_scatterv(const Tensor& input, Tensor& output, const std::vector<std::int64_t>& counts,
                       ReduceOp op = ReduceOp::sum);

  // ---- Non-blocking collectives (MPI_Iallreduce, ...; torch.distributed's async_op=True). ----
  // The same calls, checks and results as the blocking Tensor calls above, returning at once with
  // a Work (work.hpp) that completes when the call has. Arguments are checked on this rank at once
  // (UsageError from the i-call itself); what only the peers can tell (a mismatched call,
  // PeerFailure) and GPU errors come from Work::wait/test. The call runs on the communicator's
  // progress thread, started by its first non-blocking call; calls run there one at a time in the
  // order they were made, and while any is pending this communicator's blocking collectives queue
  // there too (and wait), so every rank's call order stays the order of its program. The Work keeps the
  // tensors alive; do not read the output or write the input before the call completed (MPI's
  // rule). A cuda call is ordered after the work queued on the caller's cuda::current_stream() at
  // the i-call, and its result is in place once the Work completes. send/recv do not queue.
  // last_algorithm() is the last completed call's.
  Work iallreduce(Tensor& tensor, ReduceOp op = ReduceOp::sum);
  Work iallreduce(const Tensor& input, Tensor& output, ReduceOp op = ReduceOp::sum);
  Work ireduce(Tensor& tensor, ReduceOp op, int root);
  Work ibroadcast(Tensor& tensor, int root);
  Work iallgather(const Tensor& input, Tensor& output);
  Work ireduce_scatter(const Tensor& input, Tensor& output, ReduceOp op = ReduceOp::sum);
  Work igather(const Tensor& input, Tensor& output, int root);
  Work iscatter(const Tensor& input, Tensor& output, int root);
  Work ialltoall(const Tensor& input, Tensor& output);
  Work ibarrier();

  /// The algorithm table in force (defaults, then NODAL_* overrides), for printing and tests.
  static std::vector<AlgorithmRule> algorithm_table();
  /// The algorithm the last collective call of this process took ("small", ...; "" before any).
  std::string last_algorithm() const;

 private:
  friend Communicator world_communicator();
  explicit Communicator(std::shared_ptr<detail::CommState> state) : state_(std::move(state)) {}
  detail::CommState& state() const;
  std::shared_ptr<detail::CommState> state_;
};

}  // namespace nodal
