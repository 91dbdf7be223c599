# The NCCL backend's host-side logic (collectives/src/nccl/nccl_plan.hpp, nccl_convert.hpp),
# checked without a GPU; tests/CMakeLists.txt includes this file. Only in builds with NCCL.
if(NOT NODAL_WITH_NCCL)
  return()
endif()
include(GoogleTest)
if(NOT TARGET GTest::gtest_main)
  find_package(GTest REQUIRED)
endif()

# The plan and the CPU reference (the reduce kernels' objects) are compiled in, not taken from the
# shared library: both are internal to nodal::collectives.
set(_collectives_src ${PROJECT_SOURCE_DIR}/collectives/src)
add_executable(nccl_mapping_test ${CMAKE_CURRENT_LIST_DIR}/nccl_mapping_test.cpp ${_collectives_src}/nccl/nccl_plan.cpp
                                 $<TARGET_OBJECTS:nodal_reduce_kernels>)
target_include_directories(nccl_mapping_test PRIVATE ${_collectives_src} ${PROJECT_SOURCE_DIR}/collectives/include)
target_link_libraries(nccl_mapping_test PRIVATE GTest::gtest_main nodal::runtime NCCL::nccl fmt::fmt-header-only
                      $<TARGET_NAME_IF_EXISTS:nodal_warnings>)
gtest_discover_tests(nccl_mapping_test PROPERTIES LABELS unit)
