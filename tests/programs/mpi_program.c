/* An unmodified MPI program (plain C, MPI only: no nodal) that the MPI tests build with MPICH's
 * and Open MPI's compiler wrappers and run under nodalrun. MODE picks what it does:
 *   hello           MPI_Allreduce, MPI_Bcast and a ring of MPI_Send/MPI_Recv, each checked; prints
 *                   "rank R of N: allreduce S bcast B ring P ok" and exits 0 (1 on a wrong result)
 *   abort R CODE    rank R calls MPI_Abort(MPI_COMM_WORLD, CODE); the others wait in MPI_Barrier
 *   kill R          every rank runs allreduces; rank R SIGKILLs itself in the middle, printing
 *                   "killed at <CLOCK_REALTIME seconds>" first
 *   skip-init R     rank R returns 0 without calling MPI_Init; the others MPI_Init and MPI_Barrier
 *   no-finalize R   rank R returns 0 after MPI_Init and a barrier, without MPI_Finalize
 *   die-in-init R   rank R is SIGKILLed by a thread of its own while it is in MPI_Init
 */
#include <mpi.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int env_rank(void) {
  /* Before MPI_Init: the launcher's rank variable (nodalrun's RANK). */
  const char* rank = getenv("RANK");
  return rank ? atoi(rank) : -1;
}

static void* kill_soon(void* arg) {
  (void)arg;
  usleep(2000);
  raise(SIGKILL);
  return NULL;
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "hello";
  const int who = argc > 2 ? atoi(argv[2]) : -1;
  if (strcmp(mode, "skip-init") == 0 && env_rank() == who) return 0;
  if (strcmp(mode, "die-in-init") == 0 && env_rank() == who) {
    pthread_t thread;
    pthread_create(&thread, NULL, kill_soon, NULL);
  }
  MPI_Init(&argc, &argv);
  int rank = -1, size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  if (strcmp(mode, "hello") == 0) {
    int value = rank + 1, sum = 0;
    MPI_Allreduce(&value, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    int root_value = rank == 0 ? 1000 + size : -1;
    MPI_Bcast(&root_value, 1, MPI_INT, 0, MPI_COMM_WORLD);
    int from_left = -1;
    const int right = (rank + 1) % size, left = (rank + size - 1) % size;
    if (rank % 2 == 0) {
      MPI_Send(&rank, 1, MPI_INT, right, 7, MPI_COMM_WORLD);
      MPI_Recv(&from_left, 1, MPI_INT, left, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else {
      MPI_Recv(&from_left, 1, MPI_INT, left, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      MPI_Send(&rank, 1, MPI_INT, right, 7, MPI_COMM_WORLD);
    }
    const int ok = sum == size * (size + 1) / 2 && root_value == 1000 + size && from_left == left;
    printf("rank %d of %d: allreduce %d bcast %d ring %d %s\n", rank, size, sum, root_value, from_left,
           ok ? "ok" : "WRONG");
    fflush(stdout);
    MPI_Finalize();
    return ok ? 0 : 1;
  }
  if (strcmp(mode, "abort") == 0) {
    const int code = argc > 3 ? atoi(argv[3]) : 1;
    if (rank == who) MPI_Abort(MPI_COMM_WORLD, code);
    MPI_Barrier(MPI_COMM_WORLD);
  } else if (strcmp(mode, "kill") == 0) {
    double value = 1.0, sum = 0.0;
    for (int i = 0;; ++i) {
      if (rank == who && i == 200) {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        printf("killed at %.6f\n", (double)now.tv_sec + (double)now.tv_nsec * 1e-9);
        fflush(stdout);
        raise(SIGKILL);
      }
      MPI_Allreduce(&value, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    }
  } else if (strcmp(mode, "skip-init") == 0 || strcmp(mode, "die-in-init") == 0) {
    MPI_Barrier(MPI_COMM_WORLD);
  } else if (strcmp(mode, "no-finalize") == 0) {
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == who) return 0;
  } else {
    fprintf(stderr, "mpi_program: unknown mode %s\n", mode);
    return 2;
  }
  MPI_Finalize();
  return 0;
}
