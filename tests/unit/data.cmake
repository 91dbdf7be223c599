# nodal::data's unit tests (samplers, DataLoader with and without workers); tests/CMakeLists.txt
# includes this file. ctest runs each test in a process of its own, as the forkserver tests need.
include(GoogleTest)

add_executable(dataloader_test ${CMAKE_CURRENT_LIST_DIR}/dataloader_test.cpp)
target_link_libraries(dataloader_test PRIVATE nodal::data GTest::gtest_main $<TARGET_NAME_IF_EXISTS:nodal_warnings>)
target_include_directories(dataloader_test PRIVATE ${PROJECT_SOURCE_DIR}/runtime/src)
gtest_discover_tests(dataloader_test PROPERTIES LABELS unit TIMEOUT 60)
