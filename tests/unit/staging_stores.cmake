# The choice between cached and streaming stores for staged copies (host logic, simulated costs).
add_executable(staging_stores_test ${CMAKE_CURRENT_LIST_DIR}/staging_stores_test.cpp)
target_include_directories(staging_stores_test PRIVATE ${PROJECT_SOURCE_DIR}/collectives/src)
target_link_libraries(staging_stores_test PRIVATE GTest::gtest_main nodal::collectives fmt::fmt-header-only nodal_warnings)
gtest_discover_tests(staging_stores_test PROPERTIES LABELS unit)
