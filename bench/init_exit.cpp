// A rank that joins its job and exits 0: bench/startup.sh times `LAUNCHER -n N init_exit` to see
// what nodal::init() adds to starting /bin/true. Under mpiexec.hydra or mpirun.openmpi it runs
// as a nodal singleton (rank 0 of 1), which is the cost a non-nodal launcher would pay.
#include <nodal/nodal.hpp>

int main() {
  nodal::init();
  return 0;
}
