// The environment contract between nodalrun and the ranks. Internal.
// Public names are torchrun's (RANK, WORLD_SIZE, ...), so torch.distributed env:// code runs as is.
#pragma once

namespace nodal::detail {

inline constexpr const char* kEnvRank = "RANK";
inline constexpr const char* kEnvWorldSize = "WORLD_SIZE";
inline constexpr const char* kEnvLocalRank = "LOCAL_RANK";
inline constexpr const char* kEnvLocalWorldSize = "LOCAL_WORLD_SIZE";
inline constexpr const char* kEnvMasterAddr = "MASTER_ADDR";
inline constexpr const char* kEnvMasterPort = "MASTER_PORT";
inline constexpr const char* kEnvJobId = "NODAL_JOB_ID";
/// Which start of the job this is (0: the first; nodalrun --max-restarts), and torchrun's names.
inline constexpr const char* kEnvRestartCount = "NODAL_RESTART_COUNT";
inline constexpr const char* kEnvTorchelasticRestartCount = "TORCHELASTIC_RESTART_COUNT";
inline constexpr const char* kEnvTorchelasticMaxRestarts = "TORCHELASTIC_MAX_RESTARTS";
/// The ranks' end of the control socket pair (see control.hpp).
inline constexpr const char* kEnvControlFd = "NODAL_CONTROL_FD";
/// The job arena's descriptor (see arena.hpp), inherited by every rank.
inline constexpr const char* kEnvArenaFd = "NODAL_ARENA_FD";
/// The arena's path with the file_system strategy, for processes nodalrun did not start.
inline constexpr const char* kEnvArenaPath = "NODAL_ARENA_PATH";
/// nodalrun's pid: a rank whose parent is not it any more knows the launcher died.
inline constexpr const char* kEnvLauncherPid = "NODAL_LAUNCHER_PID";
/// "forkserver" in the zygote of `nodalrun --start-method forkserver`.
inline constexpr const char* kEnvStartMethod = "NODAL_START_METHOD";
/// For the zygote: "out,err;out,err;..." the pipe fds of each rank's stdout and stderr.
inline constexpr const char* kEnvForkserverFds = "NODAL_FORKSERVER_FDS";
/// For the zygote: "cpus;cpus;..." each rank's CPU list ("0-1,4"), empty when not bound.
inline constexpr const char* kEnvForkserverCpus = "NODAL_FORKSERVER_CPUS";
/// The GPUs a process may use (CUDA's own variable); `nodalrun --gpus` sets it for every rank.
inline constexpr const char* kEnvCudaVisibleDevices = "CUDA_VISIBLE_DEVICES";
/// How CUDA numbers GPUs; `nodalrun --gpus` sets PCI_BUS_ID, the order of the driver's
/// /proc/driver/nvidia/gpus that it checks indices against (CUDA's default, FASTEST_FIRST, can
/// differ on machines with mixed GPUs: CUDA Programming Guide, "CUDA Environment Variables").
inline constexpr const char* kEnvCudaDeviceOrder = "CUDA_DEVICE_ORDER";
/// The rank's CUDA device (`nodalrun --gpus`): an index into its CUDA_VISIBLE_DEVICES.
inline constexpr const char* kEnvDevice = "NODAL_DEVICE";
/// For the zygote: "d;d;..." each rank's NODAL_DEVICE; unset without --gpus.
inline constexpr const char* kEnvForkserverDevices = "NODAL_FORKSERVER_DEVICES";
/// "1" when this node runs more ranks than it has cores (nodalrun's placement decides: hwloc's
/// cores, or the CPUs it may use when it binds nothing), else "0"; detail::oversubscribed() reads
/// it. `nodalrun -x NODAL_CROWDED=0|1` overrides it.
inline constexpr const char* kEnvCrowded = "NODAL_CROWDED";
/// Multi-node mode (nodalrun as a node's agent, launcher/src/multinode/): this node's index and
/// the number of nodes (torchrun's GROUP_RANK and GROUP_WORLD_SIZE are set alike). Absent on one
/// node.
inline constexpr const char* kEnvNodeRank = "NODAL_NODE_RANK";
inline constexpr const char* kEnvNnodes = "NODAL_NNODES";
inline constexpr const char* kEnvGroupRank = "GROUP_RANK";
inline constexpr const char* kEnvGroupWorldSize = "GROUP_WORLD_SIZE";
/// For the zygote in multi-node mode: the global rank of this node's local rank 0.
inline constexpr const char* kEnvFirstRank = "NODAL_FIRST_RANK";

}  // namespace nodal::detail
