# Builds tests/packaging/consumer against nodal and runs it under nodalrun.
#   MODE=find_package: install this build into a fresh prefix, then find_package(nodal) from it.
#   MODE=add_subdirectory: build the consumer with nodal's source tree added as a subdirectory.
# Inputs: MODE, SOURCE_DIR (nodal's source), BUILD_DIR (this build), WORK_DIR (scratch), NODALRUN,
# CXX_FLAGS and LINK_FLAGS (the build's own, so a sanitized nodal links into a sanitized consumer),
# WITH_TORCH (find_package mode: the build has the torch backend, so nodal::c10d is tried too).
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

function(run_checked)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

if(MODE STREQUAL "find_package")
  run_checked(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)
  set(configure_args -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
  if(WITH_TORCH)
    list(APPEND configure_args -DNODAL_CONSUMER_C10D=ON)
  endif()
else()
  # The consumer links nodal::collectives only: the torch backend (a minute of compiling) and the
  # CUDA kernels (nvcc; in the sanitized build under a loaded CI this build ran past 10 minutes)
  # stay off. The CUDA build itself is the main build's.
  set(configure_args -DNODAL_SOURCE_DIR=${SOURCE_DIR} -DNODAL_BUILD_TESTS=OFF -DNODAL_BUILD_EXAMPLES=OFF
                     -DNODAL_BUILD_BENCH=OFF -DNODAL_TORCH=OFF -DNODAL_CUDA=OFF)
endif()
run_checked(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/packaging/consumer -B ${WORK_DIR}/build -G Ninja ${configure_args}
            "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}" "-DCMAKE_EXE_LINKER_FLAGS=${LINK_FLAGS}")
run_checked(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
# Runs `program` of the consumer on 2 ranks; each rank's tagged line must say "<program> rank R of 2 sum 3".
function(run_consumer program)
  run_checked(${NODALRUN} -n 2 ${WORK_DIR}/build/${program})
  foreach(rank 0 1)
    if(NOT last_output MATCHES "\\[${rank}\\] ${program} rank ${rank} of 2 sum 3")
      message(FATAL_ERROR "${program} under nodalrun printed:\n${last_output}")
    endif()
  endforeach()
endfunction()
run_consumer(consumer)
if(MODE STREQUAL "find_package" AND WITH_TORCH)
  run_consumer(consumer_c10d)
endif()
message(STATUS "consumer via ${MODE}: ok")
