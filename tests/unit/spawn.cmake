# nodal::spawn's unit tests; tests/CMakeLists.txt includes this file. They start real child
# processes; StartMethod::spawn re-executes spawn_test itself (see spawn_test.cpp).
include(GoogleTest)
if(NOT TARGET GTest::gtest_main)
  find_package(GTest REQUIRED)
endif()

# A parent for spawn_test to kill: its children must die with it.
add_executable(spawn_hang ${CMAKE_CURRENT_LIST_DIR}/../programs/spawn_hang.cpp)
target_link_libraries(spawn_hang PRIVATE nodal::runtime $<TARGET_NAME_IF_EXISTS:nodal_warnings>)

add_executable(spawn_test ${CMAKE_CURRENT_LIST_DIR}/spawn_test.cpp)
target_link_libraries(spawn_test PRIVATE nodal::runtime GTest::gtest_main $<TARGET_NAME_IF_EXISTS:nodal_warnings>)
target_compile_definitions(spawn_test PRIVATE NODAL_SPAWN_HANG="$<TARGET_FILE:spawn_hang>")
add_dependencies(spawn_test spawn_hang)
# The parameter is already in the name (Methods/SpawnTest.X/fork): no "# GetParam() = ..." suffix.
gtest_discover_tests(spawn_test NO_PRETTY_VALUES PROPERTIES LABELS unit TIMEOUT 120)
