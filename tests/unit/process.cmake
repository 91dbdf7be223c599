# nodal::Process's unit tests; tests/CMakeLists.txt includes this file. They start real child
# processes; StartMethod::spawn re-executes process_test itself (see spawn_support.hpp).
include(GoogleTest)

# A parent of Process children for process_test to watch as it exits (daemons terminated, the
# others joined, a failure nobody joined printed) or to kill (its children must die with it).
add_executable(process_exit ${CMAKE_CURRENT_LIST_DIR}/../programs/process_exit.cpp)
target_link_libraries(process_exit PRIVATE nodal::runtime $<TARGET_NAME_IF_EXISTS:nodal_warnings>)

add_executable(process_test ${CMAKE_CURRENT_LIST_DIR}/process_test.cpp)
target_link_libraries(process_test PRIVATE nodal::runtime nodal_test_support GTest::gtest_main
                                           $<TARGET_NAME_IF_EXISTS:nodal_warnings>)
target_compile_definitions(process_test PRIVATE NODAL_PROCESS_EXIT="$<TARGET_FILE:process_exit>")
add_dependencies(process_test process_exit)
# The parameter is already in the name (Methods/ProcessTest.X/fork): no "# GetParam() = ..." suffix.
gtest_discover_tests(process_test NO_PRETTY_VALUES PROPERTIES LABELS unit TIMEOUT 60)
