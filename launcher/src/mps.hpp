// --mps: a CUDA MPS control daemon of the job's own, for ranks sharing a GPU.
//
// Without MPS, the processes sharing a GPU time-slice it, and every step where a rank waits on a
// peer pays for the switch of contexts. With MPS their kernels run in one GPU context, side by side.
// On 2026-11-27, on an H200 with MPS started by hand, a CUDA IPC allreduce of 4 KiB over 8 ranks
// went from 2230 us to 99 us (bench/results/2026-11-27-gpu-first-run.md).
//
// NVIDIA's mechanism, per the Multi-Process Service guide and nvidia-cuda-mps-control(1):
// - `nvidia-cuda-mps-control -d` starts the control daemon. It and its clients find each other
//   through CUDA_MPS_PIPE_DIRECTORY, and it logs to CUDA_MPS_LOG_DIRECTORY.
// - A CUDA program whose first CUDA call finds no daemon runs without MPS, silently. So nodalrun
//   waits until the daemon answers (`get_server_list` exits 0) before any rank starts.
// - `quit` on the control program's standard input stops the daemon and its servers.
// - nodalrun gives the daemon a fresh directory under TMPDIR, so the job neither needs nor
//   disturbs a machine-wide daemon, and passes both variables to every rank.
// - The daemon gets the job's GPUs as CUDA_VISIBLE_DEVICES, in PCI bus order. Its server shows
//   them to its clients renumbered from 0 (the guide's appendix on CUDA_VISIBLE_DEVICES), so
//   the ranks get 0..k-1, and NODAL_DEVICE, an index into the list, keeps its meaning.
//
// No orphan, SIGKILL included: the daemon is stopped by a guard (/bin/sh, in its own process
// group, ignoring SIGINT/SIGTERM/SIGHUP). The guard reads a pipe from nodalrun until end of file,
// which the kernel delivers when nodalrun exits for any reason. It then sends `quit`, waits for
// the daemon's pid (its nvidia-cuda-mps-control.pid) to exit, and removes the directory. This is
// ShmGuard's idea (shm_guard.hpp).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace nodal::launcher {

class MpsDaemon {
 public:
  /// Starts the job's daemon for the GPUs in `visible_devices` (the ranks' CUDA_VISIBLE_DEVICES),
  /// then its guard, and waits up to 10 s for the daemon to answer. Throws UsageError when
  /// nvidia-cuda-mps-control is not on PATH, and nodal::Error when the daemon does not start or
  /// answer; the error message holds the tail of the daemon's output. Nothing is left behind when
  /// it throws.
  explicit MpsDaemon(const std::string& visible_devices);
  /// Stops the daemon: closes the guard's pipe and waits up to 15 s for the guard.
  ~MpsDaemon();
  MpsDaemon(const MpsDaemon&) = delete;
  MpsDaemon& operator=(const MpsDaemon&) = delete;

  /// CUDA_MPS_PIPE_DIRECTORY=... and CUDA_MPS_LOG_DIRECTORY=..., for every rank's environment.
  std::vector<std::string> environment() const;
  /// The ranks' CUDA_VISIBLE_DEVICES: "0,1,...,k-1" for the daemon's k GPUs.
  std::string client_visible_devices() const;
  /// The directory that holds the pipe and log directories.
  const std::string& directory() const noexcept { return dir_; }

 private:
  void stop();

  std::string control_;  ///< the path of nvidia-cuda-mps-control
  std::string dir_;
  int gpus_ = 0;  ///< how many GPUs the daemon was given
  pid_t guard_ = -1;
  int guard_pipe_ = -1;  ///< nodalrun's write end; the guard acts at its end of file
};

}  // namespace nodal::launcher
