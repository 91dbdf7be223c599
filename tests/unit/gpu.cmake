# The GPU layer's host-side logic (the pool's block table: ranges, reference counts, liveness;
# the driver and device requirements), the behaviour without a usable GPU, and the GPU tests'
# skip rule; all run in every build. tests/CMakeLists.txt includes
# this file.
include(GoogleTest)
if(NOT TARGET GTest::gtest_main)
  find_package(GTest REQUIRED)
endif()

add_executable(gpu_unit_test ${CMAKE_CURRENT_LIST_DIR}/gpu_block_table_test.cpp
                             ${CMAKE_CURRENT_LIST_DIR}/gpu_compatibility_test.cpp
                             ${CMAKE_CURRENT_LIST_DIR}/gpu_require_test.cpp
                             ${CMAKE_CURRENT_LIST_DIR}/gpu_unavailable_test.cpp)
# block_table.hpp is internal (runtime/src/gpu); its code is in libnodal_runtime in every build.
target_include_directories(gpu_unit_test PRIVATE ${PROJECT_SOURCE_DIR}/runtime/src/gpu)
target_link_libraries(gpu_unit_test PRIVATE GTest::gtest_main nodal::runtime fmt::fmt-header-only
                                            $<TARGET_NAME_IF_EXISTS:nodal_warnings>)
gtest_discover_tests(gpu_unit_test PROPERTIES LABELS unit)
