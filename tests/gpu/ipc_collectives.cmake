# The CUDA IPC collectives on a real GPU (label gpu): ipc_program's matrix against the CPU path for
# 2, 4 and 8 ranks sharing GPU 0, and a rank SIGKILLed mid-allreduce. Without CUDA at build time or
# a GPU at run time every test skips, saying why. tests/CMakeLists.txt includes this file (after
# nodal_add_test is defined).
add_executable(ipc_collectives_test ${CMAKE_CURRENT_LIST_DIR}/ipc_collectives_test.cpp)
target_link_libraries(ipc_collectives_test PRIVATE GTest::gtest_main nodal_test_support nodal::runtime nodal_warnings)
add_dependencies(ipc_collectives_test nodalrun)
if(NODAL_WITH_CUDA)
  add_executable(ipc_program ${CMAKE_CURRENT_LIST_DIR}/ipc_program.cpp)
  target_link_libraries(ipc_program PRIVATE nodal::collectives CUDA::cudart nodal_warnings)
  add_dependencies(ipc_collectives_test ipc_program)
  target_compile_definitions(ipc_collectives_test PRIVATE NODAL_TEST_IPC_PROGRAM="$<TARGET_FILE:ipc_program>")
endif()
# TIMEOUT: the short matrix's (the test's own nodalrun --timeout 240, twice for the threshold test);
# NODAL_IPC_MATRIX=full is for scripts/gpu-check.sh tests-more, which sets its own outer timeouts.
gtest_discover_tests(ipc_collectives_test PROPERTIES LABELS gpu RUN_SERIAL TRUE TIMEOUT 540 DISCOVERY_TIMEOUT 60)
