// The rank's view of its job: who it is and how many there are.
#pragma once

#include <nodal/tensor.hpp>

#include <string>

namespace nodal {

class Arena;
class Communicator;

/// What nodal::init() returns. A cheap value: copy it freely.
/// Names follow torchrun: rank is global, local_rank counts ranks on this node.
class Context {
 public:
  int rank() const noexcept { return rank_; }
  int world_size() const noexcept { return world_size_; }
  int local_rank() const noexcept { return local_rank_; }
  int local_world_size() const noexcept { return local_world_size_; }
  /// The job's id (NODAL_JOB_ID); "singleton-<pid>" when started without nodalrun.
  const std::string& job_id() const noexcept { return job_id_; }
  /// True when nodalrun started this process, false for a singleton (rank 0 of 1).
  bool launched() const noexcept { return launched_; }
  /// The CUDA device `nodalrun --gpus` gave this rank (NODAL_DEVICE, an index into its
  /// CUDA_VISIBLE_DEVICES), or the CPU when it gave none.
  Device device() const noexcept { return device_; }
  /// The job's shared arena (nodalrun's --shm-size), or this process's own when it is a singleton.
  Arena& arena() const;
  /// The communicator of every rank of the job (rank() and world_size() as here). Defined in
  /// nodal::collectives (<nodal/communicator.hpp>): link that target to call it. The first call
  /// sets up the communicator's slots in the arena (no communication).
  Communicator world() const;

 private:
  friend Context init();
  int rank_ = 0;
  int world_size_ = 1;
  int local_rank_ = 0;
  int local_world_size_ = 1;
  std::string job_id_;
  bool launched_ = false;
  Device device_{};
};

/// Joins the job this process belongs to and returns its Context.
///
/// - Under `nodalrun` it reads RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and NODAL_* from
///   the environment. Started without nodalrun the process is rank 0 of 1 (a singleton).
/// - It maps the job's shared arena (tensors, queues and locks live there).
/// - It installs a terminate handler: an uncaught exception is reported (type, message, stack
///   trace) to nodalrun, which names it in its failure report, and the rank exits with code 1
///   (like an uncaught Python exception).
/// - With `nodalrun --start-method forkserver` the program runs once as a zygote and this call
///   forks the ranks: each child returns from init() as its rank, sharing copy-on-write all the
///   zygote loaded before the call; the zygote itself never returns.
///
/// Calling it again returns the same Context.
/// Throws ShmError when the arena cannot be mapped, UsageError when the environment is inconsistent (a RANK outside
/// WORLD_SIZE, say, or a NODAL_DEVICE that is not a non-negative integer) or when a forkserver zygote already runs
/// threads (fork would copy only the calling thread).
Context init();

/// Releases what nodal holds on the GPU while CUDA still runs: NCCL communicators
/// (ncclCommFinalize + ncclCommDestroy) and the CUDA IPC collectives' events, streams and
/// scratch. Call it before main returns in programs that ran collectives on cuda tensors (like
/// torch's destroy_process_group()); programs that forget get it from an atexit handler that
/// nodal registers after CUDA started (so it runs before CUDA's own teardown, unlike static
/// destructors). Afterwards a collective on cuda tensors throws UsageError; everything on the CPU
/// (the arena, tensors, queues, CPU collectives) keeps working. Safe to call more than once and
/// in a program that never used a GPU (then it does nothing). Does not throw: a release that
/// fails is reported on stderr.
void finalize();

}  // namespace nodal
