# The torch backend's tests (label torch), where integrations/torch was built: Python scripts in
# tests/programs/torch/ run under nodalrun with Debian's python3 and the built nodal_torch module,
# and a libtorch rank program that uses ProcessGroupNodal from C++.
add_executable(torch_c10d_program programs/torch_c10d_program.cpp)
target_link_libraries(torch_c10d_program PRIVATE nodal_c10d nodal_warnings)
nodal_add_test(torch_backend_test torch TIMEOUT 180 integration/torch_backend_test.cpp)
add_dependencies(torch_backend_test torch_c10d_program nodal_torch)
target_compile_definitions(torch_backend_test PRIVATE
                           NODAL_TEST_PYTHON="${NODAL_TORCH_PYTHON}"
                           NODAL_TEST_TORCH_MODULE_DIR="$<TARGET_FILE_DIR:nodal_torch>"
                           NODAL_TEST_TORCH_SCRIPTS="${CMAKE_CURRENT_SOURCE_DIR}/programs/torch"
                           NODAL_TEST_TORCH_PROGRAM="$<TARGET_FILE:torch_c10d_program>"
                           NODAL_TEST_TORCH_EXAMPLE="${PROJECT_SOURCE_DIR}/examples/torch_ddp/train.py")
# Across nodes: mpirun starts one nodalrun per "node" on this host (as the multi-node tests do).
if(TARGET nodal_internode_mpi AND NODAL_MPIRUN)
  add_dependencies(torch_backend_test nodal_internode_mpi)
  target_compile_definitions(torch_backend_test PRIVATE NODAL_TEST_MPIRUN="${NODAL_MPIRUN}")
endif()
