# nodal::Pool's unit tests; tests/CMakeLists.txt includes this file. They start real workers by
# fork and by forkserver.
include(GoogleTest)

add_executable(pool_test ${CMAKE_CURRENT_LIST_DIR}/pool_test.cpp)
target_link_libraries(pool_test PRIVATE nodal::runtime GTest::gtest_main $<TARGET_NAME_IF_EXISTS:nodal_warnings>)
gtest_discover_tests(pool_test PROPERTIES LABELS unit TIMEOUT 60)
