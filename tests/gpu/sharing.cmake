# CUDA tensors shared between ranks (TensorQueue hand-off by VMM pool and legacy IPC), under
# nodalrun. Label "gpu": on a machine without a usable GPU every test skips and says why, except
# one that checks the error a job gets then. tests/CMakeLists.txt includes this file after
# nodal_add_test is defined.
add_executable(gpu_queue_program ${CMAKE_CURRENT_LIST_DIR}/gpu_queue_program.cpp)
target_link_libraries(gpu_queue_program PRIVATE nodal::runtime nodal_warnings)
if(NODAL_WITH_CUDA)
  target_link_libraries(gpu_queue_program PRIVATE CUDA::cudart)
endif()

nodal_add_test(queue_gpu_test gpu TIMEOUT 600 ${CMAKE_CURRENT_LIST_DIR}/queue_gpu_test.cpp)
target_link_libraries(queue_gpu_test PRIVATE nodal::runtime)  # nodal::cuda::available()
target_compile_definitions(queue_gpu_test PRIVATE NODAL_TEST_GPU_PROGRAM="$<TARGET_FILE:gpu_queue_program>")
add_dependencies(queue_gpu_test gpu_queue_program)
