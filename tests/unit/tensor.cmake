# nodal::Tensor and its storage; tests/CMakeLists.txt includes this file.
include(GoogleTest)
if(NOT TARGET GTest::gtest_main)
  find_package(GTest REQUIRED)
endif()

add_executable(tensor_test ${CMAKE_CURRENT_LIST_DIR}/tensor_test.cpp)
target_link_libraries(tensor_test PRIVATE GTest::gtest_main nodal::runtime $<TARGET_NAME_IF_EXISTS:nodal_warnings>)
# The DLPack tests build a foreign DLManagedTensor themselves; runtime/CMakeLists.txt found dlpack.h.
if(DLPACK_INCLUDE_DIR)
  target_include_directories(tensor_test PRIVATE ${DLPACK_INCLUDE_DIR})
  target_compile_definitions(tensor_test PRIVATE NODAL_HAVE_DLPACK=1)
endif()
gtest_discover_tests(tensor_test PROPERTIES LABELS unit)
