# The choice between NCCL and CUDA IPC for collectives on cuda tensors (host-only logic).
add_executable(gpu_path_test ${CMAKE_CURRENT_LIST_DIR}/gpu_path_test.cpp)
target_include_directories(gpu_path_test PRIVATE ${PROJECT_SOURCE_DIR}/collectives/src)
target_link_libraries(gpu_path_test PRIVATE GTest::gtest_main nodal::collectives fmt::fmt-header-only nodal_warnings)
gtest_discover_tests(gpu_path_test PROPERTIES LABELS unit)
