# The reduce kernels of every instruction set against each other (tests/unit/reduce_kernels_test.cpp):
# the kernels' objects compiled in, since their functions are internal to nodal::collectives.
add_executable(reduce_kernels_test ${CMAKE_CURRENT_LIST_DIR}/reduce_kernels_test.cpp
                                   $<TARGET_OBJECTS:nodal_reduce_kernels>)
target_include_directories(reduce_kernels_test PRIVATE ${PROJECT_SOURCE_DIR}/collectives/src
                                                       ${PROJECT_SOURCE_DIR}/collectives/include)
target_link_libraries(reduce_kernels_test PRIVATE GTest::gtest_main nodal::runtime fmt::fmt-header-only nodal_warnings)
gtest_discover_tests(reduce_kernels_test PROPERTIES LABELS unit)
