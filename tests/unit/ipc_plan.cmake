# The CUDA IPC collectives' size arithmetic (collectives/src/cuda/ipc_plan.hpp), host-only: runs on
# every machine. tests/CMakeLists.txt includes this file.
include(GoogleTest)
if(NOT TARGET GTest::gtest_main)
  find_package(GTest REQUIRED)
endif()

add_executable(ipc_plan_test ${CMAKE_CURRENT_LIST_DIR}/ipc_plan_test.cpp)
# The header is internal to nodal::collectives (its symbols are in the shared library).
target_include_directories(ipc_plan_test PRIVATE ${PROJECT_SOURCE_DIR}/collectives/src)
target_link_libraries(ipc_plan_test PRIVATE GTest::gtest_main nodal::collectives $<TARGET_NAME_IF_EXISTS:nodal_warnings>)
gtest_discover_tests(ipc_plan_test PROPERTIES LABELS unit)
