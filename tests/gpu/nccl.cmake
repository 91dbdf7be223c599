# The NCCL backend's GPU tests (label gpu; tests/CMakeLists.txt includes this file). They build
# wherever nodal is built with NCCL and skip, saying why, on a machine without a usable GPU.
if(NOT NODAL_WITH_NCCL)
  return()
endif()

# The rank program: every op x dtype on cuda tensors against the CPU path, and the fault drill.
add_executable(nccl_program ${CMAKE_CURRENT_LIST_DIR}/nccl_program.cpp)
target_link_libraries(nccl_program PRIVATE nodal::collectives nodal_warnings)

nodal_add_test(nccl_gpu_test gpu TIMEOUT 600 ${CMAKE_CURRENT_LIST_DIR}/nccl_test.cpp)
target_compile_definitions(nccl_gpu_test PRIVATE NODAL_TEST_NCCL_PROGRAM="$<TARGET_FILE:nccl_program>")
target_link_libraries(nccl_gpu_test PRIVATE nodal::runtime)
add_dependencies(nccl_gpu_test nccl_program)
