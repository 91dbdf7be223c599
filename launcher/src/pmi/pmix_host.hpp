// nodalrun as the PMIx server of a one-node job, so that an unmodified MPI program (Open MPI
// 4.1 built against an external PMIx) started by nodalrun as N processes is one N-rank job, the
// way `srun --mpi=pmix` direct-launches it. OpenPMIx (libpmix) does the protocol; this is the
// host's glue: the job's description for register_nspace and the few server callbacks a one-node
// job needs. The ideas come from OpenPMIx's examples/server.c and test/simple/simptest.c, Slurm's
// mpi/pmix plugin (fence and abort handling) and the keys Open MPI 4.1's ess/pmi reads.
//
// PMIx's server is one per process and PMIx 4.2 cannot start it twice: the first PmixHost starts
// it, and it runs until the process exits; each PmixHost registers only its job (one PmixHost at
// a time). Its callbacks run on PMIx's progress thread, which inherits the signal mask of the
// thread that constructs the first PmixHost: signals nodalrun reads through signalfd must be
// blocked before, so they stay blocked there too.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace nodal::launcher {

/// Whether this nodalrun was built with libpmix: true from pmix_host.cpp, false from
/// pmix_host_disabled.cpp (whose PmixHost throws).
bool pmix_built() noexcept;

/// What a PMIx client did that nodalrun must act on, reported from PMIx's progress thread.
struct PmixEvent {
  enum class Kind { connected, finalized, abort };
  Kind kind;
  int rank = -1;        ///< the client's rank (for abort: the caller's rank)
  int status = 0;       ///< abort: the status the client passed to PMIx_Abort (MPI_Abort's errorcode)
  std::string message;  ///< abort: its message (Open MPI 4.1 passes "N/A")
};

/// A PMIx server for one job of `size` ranks, all on this node, namespace `nspace`.
class PmixHost {
 public:
  /// Starts PMIx's server if this process has none yet (PMIx_server_init, `tmpdir` as its
  /// tmpdir; clients reach it over TCP on the loopback interface, the only transport PMIx 4 has;
  /// no rendezvous files), then PMIx_server_register_nspace with the job's info and
  /// PMIx_server_register_client for each rank (this process's uid/gid). Open MPI's session
  /// directories go to `tmpdir`/session (`tmpdir` exists). Throws std::runtime_error with the
  /// PMIx error string on failure, and when another PmixHost exists in this process.
  PmixHost(const std::string& nspace, int size, const std::string& tmpdir);
  /// Deregisters the job (PMIx_server_deregister_nspace, waiting up to 10 s for PMIx's thread:
  /// no callback about this job runs afterwards) and removes `tmpdir`/session. Not when a rank
  /// did not complete its connection (PMIx 4.2 may have freed that rank's record: see the .cpp),
  /// or when the wait runs out: the job then stays registered. The server stays up for the next
  /// PmixHost: PMIx 4.2 cannot be initialized again after PMIx_server_finalize. Ranks still
  /// running lose their server: kill and reap them first.
  ~PmixHost();
  PmixHost(const PmixHost&) = delete;
  PmixHost& operator=(const PmixHost&) = delete;

  /// The environment rank `rank`'s process needs, NAME=VALUE (from PMIx_server_setup_fork, plus
  /// OMPI_MCA_schizo=^orte, without which Open MPI 4.1 runs as a singleton: see the .cpp), to add
  /// to (replacing the same names in) the environment the rank would otherwise get. Throws
  /// std::runtime_error.
  std::vector<std::string> client_environment(int rank);
  /// Readable (an eventfd, nonblocking, close-on-exec) while events wait: for the launcher's epoll loop.
  int event_fd() const;
  /// The events since the last call (and clears the fd's count), oldest first. A rank's events
  /// come in order connected, then finalized or abort; a rank that dies without PMIx_Finalize
  /// (a crash, a kill, exit() without MPI_Finalize) sends none after connected.
  std::vector<PmixEvent> take_events();

  struct State;  ///< what PMIx's callbacks share with the launcher's thread (in the .cpp)

 private:
  void release(bool registered) noexcept;

  std::string nspace_;
  int size_;
  std::string session_dir_;  ///< `tmpdir`/session: Open MPI's session directories
  std::unique_ptr<State> state_;
};

}  // namespace nodal::launcher
