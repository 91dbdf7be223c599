// The MPI engine behind nodalrun's multi-node mode (multinode/internode_plugin.h): a shared
// library that nodalrun loads only when an outer launcher started it as one node's agent. The
// agents are the MPI processes (the ranks are not: only what mpirun or srun started may call
// MPI_Init); collectives run on a duplicate of MPI_COMM_WORLD, notices (failures, heartbeats) on
// another and point-to-point operations (send/recv between ranks of different nodes) on a third,
// so none matches another's messages.
#include "multinode/internode_plugin.h"

#include <mpi.h>

#include <climits>
#include <cstdio>
#include <cstring>
#include <list>
#include <string>
#include <vector>

struct nodal_internode {
  MPI_Comm collectives = MPI_COMM_NULL;
  MPI_Comm notices = MPI_COMM_NULL;
  MPI_Comm p2p = MPI_COMM_NULL;
  std::vector<MPI_Request> in_flight;  // the collective in flight (an exchange: one request per transfer)
  std::vector<int> transfer_sizes;  // exchange_start's, as MPI counts
  nodal_internode_transfer* exchange = nullptr;  // the exchange in flight's transfers (their `received`)
  std::vector<MPI_Status> statuses;
  int rank = 0;
  int size = 1;
  std::vector<int> counts, displs;  // the allgatherv in flight
  std::list<std::pair<MPI_Request, std::string>> sends;  // notices on their way
  // Point-to-point operations in flight: request, cookie, and for a receive the bytes expected.
  struct Operation {
    MPI_Request request;
    uint64_t cookie;
    int expected;  // -1 for a send
  };
  std::vector<Operation> operations;
};

namespace {

constexpr int kNoticeTag = 7;
constexpr int kExchangeTag = 8;  // on `collectives`, whose other operations are MPI collectives

/// The request of the one collective about to start.
MPI_Request* start(nodal_internode* self) {
  self->in_flight.assign(1, MPI_REQUEST_NULL);
  self->exchange = nullptr;
  return self->in_flight.data();
}

int say(char* error, size_t size, const std::string& text) {
  std::snprintf(error, size, "%s", text.c_str());
  return 1;
}

int mpi_error(char* error, size_t size, const char* call, int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return say(error, size, std::string(call) + ": " + std::string(text, static_cast<size_t>(length)));
}

#define NODAL_MPI(call)                                  \
  do {                                                   \
    int code_ = (call);                                  \
    if (code_ != MPI_SUCCESS) return mpi_error(error, error_size, #call, code_); \
  } while (0)

nodal_internode* init(char* error, size_t error_size) {
  int provided = 0;
  int code = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  if (code != MPI_SUCCESS) {
    mpi_error(error, error_size, "MPI_Init_thread", code);
    return nullptr;
  }
  // abort() comes from nodalrun's main thread while the agent's may be inside MPI.
  if (provided < MPI_THREAD_MULTIPLE) {
    say(error, error_size,
        "the MPI library gives thread level " + std::to_string(provided) + ", and nodal's engine needs "
        "MPI_THREAD_MULTIPLE (" + std::to_string(MPI_THREAD_MULTIPLE) + "): use an MPI built with thread support");
    MPI_Finalize();
    return nullptr;
  }
  auto* self = new nodal_internode;
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int status = MPI_Comm_dup(MPI_COMM_WORLD, &self->collectives);
  if (status == MPI_SUCCESS) status = MPI_Comm_dup(MPI_COMM_WORLD, &self->notices);
  if (status == MPI_SUCCESS) status = MPI_Comm_dup(MPI_COMM_WORLD, &self->p2p);
  if (status != MPI_SUCCESS) {
    mpi_error(error, error_size, "MPI_Comm_dup", status);
    delete self;
    return nullptr;  // nodalrun exits; the launcher ends the other nodes' agents
  }
  MPI_Comm_set_errhandler(self->collectives, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(self->notices, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(self->p2p, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &self->rank);
  MPI_Comm_size(MPI_COMM_WORLD, &self->size);
  return self;
}

int rank(nodal_internode* self) { return self->rank; }
int size(nodal_internode* self) { return self->size; }

int to_int(uint64_t value, int* out, char* error, size_t error_size) {
  if (value > static_cast<uint64_t>(INT_MAX)) return say(error, error_size, "a count beyond MPI's int");
  *out = static_cast<int>(value);
  return 0;
}

int allgather_start(nodal_internode* self, const void* send, void* recv, uint64_t bytes, char* error, size_t error_size) {
  int n = 0;
  if (to_int(bytes, &n, error, error_size)) return 1;
  NODAL_MPI(MPI_Iallgather(send, n, MPI_BYTE, recv, n, MPI_BYTE, self->collectives, start(self)));
  return 0;
}

int allgatherv_start(nodal_internode* self, void* buffer, const uint64_t* counts, const uint64_t* displs, char* error,
                     size_t error_size) {
  self->counts.resize(static_cast<size_t>(self->size));
  self->displs.resize(static_cast<size_t>(self->size));
  for (int k = 0; k < self->size; ++k) {
    if (to_int(counts[k], &self->counts[k], error, error_size) || to_int(displs[k], &self->displs[k], error, error_size)) {
      return 1;
    }
  }
  NODAL_MPI(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_BYTE, buffer, self->counts.data(), self->displs.data(), MPI_BYTE,
                            self->collectives, start(self)));
  return 0;
}

int broadcast_start(nodal_internode* self, void* buffer, uint64_t bytes, int root, char* error, size_t error_size) {
  int n = 0;
  if (to_int(bytes, &n, error, error_size)) return 1;
  NODAL_MPI(MPI_Ibcast(buffer, n, MPI_BYTE, root, self->collectives, start(self)));
  return 0;
}

int barrier_start(nodal_internode* self, char* error, size_t error_size) {
  NODAL_MPI(MPI_Ibarrier(self->collectives, start(self)));
  return 0;
}

int exchange_start(nodal_internode* self, nodal_internode_transfer* transfers, uint32_t count, char* error,
                   size_t error_size) {
  self->exchange = nullptr;  // until every transfer has started
  // Every transfer checked before any starts.
  std::vector<int>& sizes = self->transfer_sizes;
  sizes.resize(count);
  for (uint32_t i = 0; i < count; ++i) {
    const int kind = transfers[i].kind;
    if (kind != NODAL_INTERNODE_SEND && kind != NODAL_INTERNODE_RECV && kind != NODAL_INTERNODE_RECV_UP_TO) {
      return say(error, error_size, "an exchange transfer of unknown kind " + std::to_string(kind));
    }
    if (to_int(transfers[i].bytes, &sizes[i], error, error_size)) return 1;
  }
  self->in_flight.assign(count, MPI_REQUEST_NULL);
  for (uint32_t i = 0; i < count; ++i) {
    nodal_internode_transfer& t = transfers[i];
    t.received = 0;
    MPI_Request* request = &self->in_flight[i];
    if (t.kind == NODAL_INTERNODE_SEND) {
      NODAL_MPI(MPI_Isend(t.data, sizes[i], MPI_BYTE, t.peer, kExchangeTag, self->collectives, request));
    } else {
      // A longer message than `bytes` fails in MPI itself (MPI_ERR_TRUNCATE, reported by test).
      NODAL_MPI(MPI_Irecv(t.data, sizes[i], MPI_BYTE, t.peer, kExchangeTag, self->collectives, request));
    }
  }
  self->exchange = transfers;  // test() writes their `received`
  return 0;
}

/// Forgets the notices sent earlier that have gone.
void forget_sent_notices(nodal_internode* self) {
  for (auto it = self->sends.begin(); it != self->sends.end();) {
    int sent = 0;
    MPI_Test(&it->first, &sent, MPI_STATUS_IGNORE);
    it = sent ? self->sends.erase(it) : std::next(it);
  }
}

int test(nodal_internode* self, int* done, char* error, size_t error_size) {
  *done = 0;
  nodal_internode_transfer* transfers = self->exchange;
  self->exchange = nullptr;  // written to only below, once the exchange is done without error
  self->statuses.resize(self->in_flight.size());
  const int code = MPI_Testall(static_cast<int>(self->in_flight.size()), self->in_flight.data(), done, self->statuses.data());
  if (code == MPI_ERR_IN_STATUS) {  // say which transfer failed and how (e.g. MPI_ERR_TRUNCATE)
    for (const MPI_Status& status : self->statuses) {
      if (status.MPI_ERROR != MPI_SUCCESS && status.MPI_ERROR != MPI_ERR_PENDING) {
        return mpi_error(error, error_size, "MPI_Testall (a transfer with another agent)", status.MPI_ERROR);
      }
    }
  }
  NODAL_MPI(code);
  forget_sent_notices(self);
  if (!*done) self->exchange = transfers;
  if (*done && transfers != nullptr) {
    for (size_t i = 0; i < self->in_flight.size(); ++i) {
      nodal_internode_transfer& t = transfers[i];
      if (t.kind == NODAL_INTERNODE_SEND) continue;
      int received = 0;
      MPI_Get_count(&self->statuses[i], MPI_BYTE, &received);
      t.received = static_cast<uint64_t>(received);
      if (t.kind == NODAL_INTERNODE_RECV && t.received != t.bytes) {
        return say(error, error_size, "an exchange received " + std::to_string(received) + " bytes from agent " +
                                          std::to_string(t.peer) + " where " + std::to_string(t.bytes) +
                                          " were expected");
      }
    }
  }
  return 0;
}

int send_notice(nodal_internode* self, int dest, const void* data, uint32_t bytes, char* error, size_t error_size) {
  forget_sent_notices(self);  // send/recv between nodes sends notices without collectives between them
  self->sends.emplace_back(MPI_REQUEST_NULL, std::string(static_cast<const char*>(data), bytes));
  auto& [request, copy] = self->sends.back();
  NODAL_MPI(MPI_Isend(copy.data(), static_cast<int>(bytes), MPI_BYTE, dest, kNoticeTag, self->notices, &request));
  return 0;
}

int poll_notice(nodal_internode* self, int* source, void* data, uint32_t capacity, uint32_t* bytes, char* error,
                size_t error_size) {
  *source = -1;
  int pending = 0;
  MPI_Status status;
  NODAL_MPI(MPI_Iprobe(MPI_ANY_SOURCE, kNoticeTag, self->notices, &pending, &status));
  if (!pending) return 0;
  int count = 0;
  MPI_Get_count(&status, MPI_BYTE, &count);
  std::vector<char> message(static_cast<size_t>(count));
  NODAL_MPI(MPI_Recv(message.data(), count, MPI_BYTE, status.MPI_SOURCE, kNoticeTag, self->notices, MPI_STATUS_IGNORE));
  *bytes = static_cast<uint32_t>(std::min<size_t>(message.size(), capacity));
  std::memcpy(data, message.data(), *bytes);
  *source = status.MPI_SOURCE;
  return 0;
}

int p2p_tag_limit(nodal_internode*) {
  int* limit = nullptr;
  int found = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &limit, &found);
  return found && limit ? *limit : 32767;
}

int p2p_isend(nodal_internode* self, int dest, int tag, const void* data, uint64_t bytes, uint64_t cookie, char* error,
              size_t error_size) {
  int n = 0;
  if (to_int(bytes, &n, error, error_size)) return 1;
  MPI_Request request = MPI_REQUEST_NULL;
  NODAL_MPI(MPI_Isend(data, n, MPI_BYTE, dest, tag, self->p2p, &request));
  self->operations.push_back({request, cookie, -1});
  return 0;
}

int p2p_irecv(nodal_internode* self, int source, int tag, void* data, uint64_t bytes, uint64_t cookie, char* error,
              size_t error_size) {
  int n = 0;
  if (to_int(bytes, &n, error, error_size)) return 1;
  MPI_Request request = MPI_REQUEST_NULL;
  NODAL_MPI(MPI_Irecv(data, n, MPI_BYTE, source, tag, self->p2p, &request));
  self->operations.push_back({request, cookie, n});
  return 0;
}

int p2p_completed(nodal_internode* self, uint64_t* cookies, uint32_t capacity, uint32_t* count, char* error,
                  size_t error_size) {
  *count = 0;
  auto& ops = self->operations;
  for (size_t i = 0; i < ops.size() && *count < capacity;) {
    int done = 0;
    MPI_Status status;
    NODAL_MPI(MPI_Test(&ops[i].request, &done, &status));
    if (!done) {
      ++i;
      continue;
    }
    if (ops[i].expected >= 0) {
      int received = 0;
      MPI_Get_count(&status, MPI_BYTE, &received);
      if (received != ops[i].expected) {
        return say(error, error_size, "a point-to-point message of " + std::to_string(received) + " bytes where " +
                                          std::to_string(ops[i].expected) + " were expected");
      }
    }
    cookies[(*count)++] = ops[i].cookie;
    ops.erase(ops.begin() + static_cast<std::ptrdiff_t>(i));
  }
  return 0;
}

int p2p_cancel_all(nodal_internode* self, char* error, size_t error_size) {
  auto& ops = self->operations;
  for (auto& op : ops) MPI_Cancel(&op.request);
  const double until = MPI_Wtime() + 1.0;
  while (!ops.empty() && MPI_Wtime() < until) {
    for (size_t i = 0; i < ops.size();) {
      int done = 0;
      MPI_Test(&ops[i].request, &done, MPI_STATUS_IGNORE);
      if (done) {
        ops.erase(ops.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
  }
  if (!ops.empty()) {
    const size_t left = ops.size();
    for (auto& op : ops) MPI_Request_free(&op.request);
    ops.clear();
    return say(error, error_size, std::to_string(left) + " point-to-point operations did not end when cancelled");
  }
  return 0;
}

void abort_job(nodal_internode*, int code) { MPI_Abort(MPI_COMM_WORLD, code); }

int finalize(nodal_internode* self, char* error, size_t error_size) {
  // Notices still on their way (small: sent eagerly) complete without us.
  for (auto& [request, copy] : self->sends) MPI_Request_free(&request);
  MPI_Comm_free(&self->collectives);
  MPI_Comm_free(&self->notices);
  MPI_Comm_free(&self->p2p);
  delete self;
  NODAL_MPI(MPI_Finalize());
  return 0;
}

constexpr nodal_internode_ops kOps = {
    NODAL_INTERNODE_ABI, "MPI", init, rank, size, allgather_start, allgatherv_start, broadcast_start, barrier_start, test,
    send_notice, poll_notice, abort_job, finalize, p2p_tag_limit, p2p_isend, p2p_irecv, p2p_completed, p2p_cancel_all,
    exchange_start,
};

}  // namespace

extern "C" const nodal_internode_ops* nodal_internode_plugin(void) { return &kOps; }
