# The multi-node tests (label multinode): Open MPI's mpirun starts one nodalrun per "node", either
# on this host (each nodalrun its own node, --oversubscribe) or in network namespaces built by
# tests/support/netns-cluster.sh (root; real TCP between nodes); or Slurm's srun --mpi=pmix starts
# them on a real Slurm cluster in namespaces (tests/support/slurm-cluster.sh, root). Needs
# nodalrun's MPI engine.
add_executable(multinode_program programs/multinode_program.cpp)
target_link_libraries(multinode_program PRIVATE nodal::collectives nodal_warnings)
# The engine's C interface, driven directly by mpirun's 2 processes (no nodalrun).
add_executable(internode_engine_program programs/internode_engine_program.cpp)
target_include_directories(internode_engine_program PRIVATE ${PROJECT_SOURCE_DIR}/launcher/src)
target_link_libraries(internode_engine_program PRIVATE ${CMAKE_DL_LIBS} nodal_warnings)
find_program(NODAL_MPIRUN mpirun.openmpi)
find_program(NODAL_SRUN srun)  # tests/support/slurm-cluster.sh says when a cluster cannot be built
if(TARGET nodal_internode_mpi AND NODAL_MPIRUN)
  nodal_add_test(multinode_test multinode SERIAL TIMEOUT 300 integration/multinode_test.cpp)
  add_dependencies(multinode_test multinode_program coll_program vector_program fashion_mnist nodal_internode_mpi
                   internode_engine_program)
  target_link_libraries(multinode_test PRIVATE Boost::headers)  # the --report JSON
  target_compile_definitions(multinode_test PRIVATE NODAL_TEST_MPIRUN="${NODAL_MPIRUN}"
                             NODAL_TEST_MULTINODE_PROGRAM="$<TARGET_FILE:multinode_program>"
                             NODAL_TEST_ENGINE_PROGRAM="$<TARGET_FILE:internode_engine_program>"
                             NODAL_TEST_ENGINE="$<TARGET_FILE:nodal_internode_mpi>"
                             NODAL_TEST_FASHION_MNIST="$<TARGET_FILE:fashion_mnist>"
                             NODAL_TEST_VECTOR_PROGRAM="$<TARGET_FILE:vector_program>"
                             NODAL_TEST_NETNS_CLUSTER="${CMAKE_CURRENT_LIST_DIR}/../support/netns-cluster.sh"
                             NODAL_TEST_SLURM_CLUSTER="${CMAKE_CURRENT_LIST_DIR}/../support/slurm-cluster.sh"
                             NODAL_TEST_SRUN="$<IF:$<BOOL:${NODAL_SRUN}>,${NODAL_SRUN},srun>")
else()
  message(STATUS "no multi-node tests: they need Open MPI's mpirun and nodalrun's MPI engine (Debian openmpi-bin, libopenmpi-dev)")
endif()
