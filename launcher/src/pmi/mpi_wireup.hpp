// How nodalrun lets an unmodified MPI program's ranks find each other (`nodalrun --mpi`): the
// wire-up servers a launcher offers (PMI-1 for MPICH, pmi1_server.hpp; PMIx for Open MPI,
// pmix_host.hpp) and what each rank has done with MPI, which decides when an MPI job has failed
// even though no rank crashed: MPI_Abort, a rank that ends without MPI_Finalize, or one that ends
// without ever calling MPI_Init while its peers wait for it in MPI_Init (mpirun and Hydra treat
// the first two the same way; the third would hang their jobs).
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "../options.hpp"
#include "pmi1_server.hpp"

namespace nodal::launcher {

class PmixHost;

/// Why an MPI job failed, said by the wire-up: the rank to blame and nodalrun's exit code.
struct MpiFailure {
  int rank = -1;
  int exit_code = 1;
  std::string detail;
};

class MpiWireUp {
 public:
  /// The servers `support` asks for (automatic: both; none: none) for a job of `size` ranks,
  /// `job_id` naming its key-value space and PMIx namespace; PMIx's rendezvous files go in a
  /// private directory under $TMPDIR (/tmp), removed with this object. Throws std::system_error
  /// or std::runtime_error when a server cannot start.
  MpiWireUp(MpiSupport support, const std::string& job_id, int size);
  ~MpiWireUp();
  MpiWireUp(const MpiWireUp&) = delete;
  MpiWireUp& operator=(const MpiWireUp&) = delete;

  /// What rank `rank` gets: environment entries (NAME=VALUE) and fds to inherit across exec.
  std::vector<std::string> environment(int rank);
  std::vector<int> inherited_fds(int rank) const;
  /// Once every rank was started: nodalrun's copies of their ends close.
  void ranks_started();

  /// The fds the event loop watches; on_readable(i) when fds()[i] is readable.
  const std::vector<int>& fds() const { return fds_; }
  /// Serves what arrived and returns the failure it means, if any.
  std::optional<MpiFailure> on_readable(std::size_t index);
  /// Rank `rank` exited (`clean`: with code 0): what it said last is read first (an MPI_Abort
  /// that came with its exit is the failure, not the exit code); then the failure a clean exit is
  /// in an MPI job (no MPI_Finalize, or no MPI_Init while others started MPI), if any.
  std::optional<MpiFailure> on_rank_exit(int rank, bool clean);

 private:
  std::optional<MpiFailure> observe(const std::vector<MpiEvent>& events);

  enum class State { not_started, started, finalized, left_without_init };
  std::string pmix_dir_;  ///< PMIx's rendezvous directory (removed after the server is gone)
  std::unique_ptr<Pmi1Server> pmi1_;
  std::unique_ptr<PmixHost> pmix_;
  std::vector<int> fds_;  ///< PMI-1: rank r's at r; PMIx's event fd last
  std::vector<State> states_;
  bool any_started_ = false;
};

}  // namespace nodal::launcher
