/* The C interface between nodalrun and an inter-node engine loaded at run time (dlopen), so
 * that nodalrun on one node runs without any MPI library installed, and the engine's C++ runtime
 * never meets nodalrun's (which links libstdc++ statically). The engine nodal ships is MPI
 * (mpi/internode_mpi.cpp, libnodal_internode_mpi.so); Gloo or UCC could provide the same table.
 *
 * Threads: init and every later call come from one thread (the agent's), except abort, which
 * any thread may call. At most one collective is in flight, and beside it any number of
 * point-to-point operations. Functions returning int return 0 on success, else non-zero with a
 * message in `error` (NUL-terminated, at most error_size bytes). */
#ifndef NODAL_INTERNODE_PLUGIN_H
#define NODAL_INTERNODE_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NODAL_INTERNODE_ABI 5

typedef struct nodal_internode nodal_internode; /* the engine's handle */

/* What one transfer of an exchange_start does (its `kind`). */
enum {
  NODAL_INTERNODE_RECV = 0,       /* receive exactly `bytes` into `data` from agent `peer` */
  NODAL_INTERNODE_SEND = 1,       /* send `bytes` at `data` to agent `peer` */
  NODAL_INTERNODE_RECV_UP_TO = 2  /* receive a message of at most `bytes` (a longer one is an error);
                                     how long it was goes to `received` */
};

/* One transfer of an exchange_start. */
typedef struct nodal_internode_transfer {
  int peer;
  int kind; /* NODAL_INTERNODE_RECV, _SEND or _RECV_UP_TO */
  void* data;
  uint64_t bytes;
  uint64_t received; /* set by the engine once test reports the exchange done: the bytes that came
                        (a receive), 0 (a send) */
} nodal_internode_transfer;

typedef struct nodal_internode_ops {
  int abi; /* NODAL_INTERNODE_ABI */
  const char* name;
  /* Joins the agents of the job (MPI_Init_thread, needing MPI_THREAD_MULTIPLE); NULL on failure. */
  nodal_internode* (*init)(char* error, size_t error_size);
  int (*rank)(nodal_internode*);
  int (*size)(nodal_internode*);
  /* Starts an allgather of `bytes` from each agent: recv holds size * bytes, agent k's at k * bytes. */
  int (*allgather_start)(nodal_internode*, const void* send, void* recv, uint64_t bytes, char* error, size_t error_size);
  /* Starts an allgather in place: agent k's counts[k] bytes at displs[k] of `buffer` (its own
   * part is already there). */
  int (*allgatherv_start)(nodal_internode*, void* buffer, const uint64_t* counts, const uint64_t* displs, char* error,
                          size_t error_size);
  /* Starts a broadcast of `bytes` at `buffer` from agent `root`. */
  int (*broadcast_start)(nodal_internode*, void* buffer, uint64_t bytes, int root, char* error, size_t error_size);
  /* Starts a barrier of every agent. */
  int (*barrier_start)(nodal_internode*, char* error, size_t error_size);
  /* Progresses the collective in flight: *done = 1 once it has completed. */
  int (*test)(nodal_internode*, int* done, char* error, size_t error_size);
  /* Sends a short message to agent `dest` outside the collectives; returns at once (the engine
   * keeps and frees the request). */
  int (*send_notice)(nodal_internode*, int dest, const void* data, uint32_t bytes, char* error, size_t error_size);
  /* Receives one pending notice: *source = -1 when there is none. */
  int (*poll_notice)(nodal_internode*, int* source, void* data, uint32_t capacity, uint32_t* bytes, char* error,
                     size_t error_size);
  /* Ends the whole job through the launcher with `code` (MPI_Abort); may not return. */
  void (*abort)(nodal_internode*, int code);
  /* Leaves the job (MPI_Finalize) and frees the handle. */
  int (*finalize)(nodal_internode*, char* error, size_t error_size);
  /* Point-to-point between agents, apart from the collectives and the notices: messages from
   * one agent to another with one tag match in the order they were started (MPI's rule). */
  /* The largest tag (at least 32767). */
  int (*p2p_tag_limit)(nodal_internode*);
  /* Starts sending `bytes` at `data` to agent `dest`; `data` stays untouched until the operation
   * is reported by p2p_completed with `cookie`. */
  int (*p2p_isend)(nodal_internode*, int dest, int tag, const void* data, uint64_t bytes, uint64_t cookie, char* error,
                   size_t error_size);
  /* Starts receiving exactly `bytes` from agent `source` into `data` (another size is an error
   * when it completes). */
  int (*p2p_irecv)(nodal_internode*, int source, int tag, void* data, uint64_t bytes, uint64_t cookie, char* error,
                   size_t error_size);
  /* Progresses the operations started: the cookies of up to `capacity` that have completed since
   * the last call go to `cookies`, their number to *count. */
  int (*p2p_completed)(nodal_internode*, uint64_t* cookies, uint32_t capacity, uint32_t* count, char* error,
                       size_t error_size);
  /* Cancels every operation not completed (the job is ending), waiting up to a second for the
   * engine to let go of their memory. */
  int (*p2p_cancel_all)(nodal_internode*, char* error, size_t error_size);
  /* Starts `count` transfers with other agents as the collective in flight (completed through
   * test); each matches the peer's transfer of the other direction in the order both were started
   * (the agents' pipelined chain of a folded step: node_bridge.hpp). `transfers` stays valid until
   * test reports the exchange done, which writes each one's `received`. */
  int (*exchange_start)(nodal_internode*, nodal_internode_transfer* transfers, uint32_t count, char* error,
                        size_t error_size);
} nodal_internode_ops;

/* The symbol the engine exports. */
const nodal_internode_ops* nodal_internode_plugin(void);

#ifdef __cplusplus
}
#endif

#endif
