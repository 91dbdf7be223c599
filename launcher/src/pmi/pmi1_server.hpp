// The PMI-1 wire protocol's server side (the "simple" PMI that MPICH's client library speaks and
// Hydra's proxy serves), for one job on one node: a socketpair per rank, whose client end the
// rank finds in PMI_FD (with PMI_RANK, PMI_SIZE), one line per command and per answer:
//   cmd=init pmi_version=1 pmi_subversion=1   ->  cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0
//   cmd=put kvsname=K key=k value=v           ->  cmd=put_result rc=0 msg=success
//   cmd=barrier_in (from every rank)          ->  cmd=barrier_out (to every rank)
// Sources: MPICH's src/pmi/maint/pmi-1.1.txt (the commands and their attributes), its client
// src/pmi/simple/simple_pmi.c and Hydra's pmiserv_pmi_v1.c (the answers' exact words, e.g.
// "key_<k>_not_found"), and `mpiexec.hydra -verbose` on this machine (the commands MPICH 4.0's
// MPI_Init sends, and PMI_process_mapping "(vector,(0,1,N))": one node with every rank).
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace nodal::launcher {

/// What a rank's PMI-1 traffic means for the job (PMI-1 and PMIx report the same things).
struct MpiEvent {
  enum class Kind {
    init,      ///< the rank started MPI (PMI init, PMIx client connected)
    finalize,  ///< it ended MPI cleanly
    abort,     ///< MPI_Abort: `code` is its error code, `message` what it said
    protocol,  ///< it sent something the server does not serve: `message` says what
  };
  Kind kind = Kind::init;
  int rank = -1;
  int code = 0;
  std::string message;
};

class Pmi1Server {
 public:
  /// A server for ranks 0..size-1 whose key-value space is called `kvsname` (no spaces or '=').
  /// Makes the socketpairs (close-on-exec both). Throws std::system_error.
  Pmi1Server(std::string kvsname, int size);
  ~Pmi1Server();
  Pmi1Server(const Pmi1Server&) = delete;
  Pmi1Server& operator=(const Pmi1Server&) = delete;

  /// The rank's end, for it to inherit across exec, and PMI_FD, PMI_RANK, PMI_SIZE naming it.
  int client_fd(int rank) const { return client_fds_[rank]; }
  std::vector<std::string> environment(int rank) const;
  /// Closes the client ends here once the ranks have them (a dead rank is then end of file).
  void close_client_ends();
  /// nodalrun's end of rank `rank`'s connection, for the event loop (nonblocking).
  int server_fd(int rank) const { return server_fds_[rank]; }

  /// Reads what rank `rank` sent, answers every complete command and returns what the job must
  /// know. Never blocks. At end of file (the rank exited or closed it) the connection is closed.
  std::vector<MpiEvent> on_readable(int rank);

 private:
  void handle(int rank, const std::string& line, std::vector<MpiEvent>& events);
  void reply(int rank, const std::string& line);

  std::string kvsname_;
  int size_;
  std::vector<int> server_fds_;
  std::vector<int> client_fds_;
  std::vector<std::string> pending_;  ///< per rank: bytes after the last complete line
  std::vector<bool> in_barrier_;
  int barrier_count_ = 0;
  std::map<std::string, std::string> kvs_;
  std::map<std::string, std::string> published_;  ///< publish_name / lookup_name
};

}  // namespace nodal::launcher
