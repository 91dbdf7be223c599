# Checks nodal's NCCL decision (cmake/NodalNccl.cmake, cmake/FindNCCL.cmake) by configuring
# tests/packaging/nccl_config with this machine's own NCCL hidden, so that the result is the same
# with or without one installed:
#   a. no NCCL, NODAL_NCCL default         -> configure fails, naming NCCL and -DNODAL_NCCL=OFF
#   b. no NCCL, NODAL_NCCL=OFF             -> succeeds, NCCL off
#   c. NCCL_ROOT with only include/nccl.h and lib/libnccl.so.2 -> found there, version printed
#   d. a fake nvidia-nccl-cu13 wheel on PYTHONPATH, no NCCL_ROOT -> found there (needs python3)
#   e. NODAL_NCCL=ON in a build without CUDA -> configure fails
# Needs no CUDA and builds nothing. Inputs: SOURCE_DIR (nodal's source), WORK_DIR (scratch,
# recreated), optionally GENERATOR and MAKE_PROGRAM (default: Ninja from PATH).
if(NOT SOURCE_DIR OR NOT WORK_DIR)
  message(FATAL_ERROR "usage: cmake -DSOURCE_DIR=<nodal> -DWORK_DIR=<scratch> -P check_nccl_config.cmake")
endif()
if(NOT GENERATOR)
  set(GENERATOR Ninja)
endif()
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

# Hide NCCL: CMAKE_IGNORE_PATH drops exact directories from every search, hints included
# (CMAKE_IGNORE_PREFIX_PATH would spare FindNCCL's /usr/local/cuda hint). Covered: the CUDA
# install and its real path, the system prefixes, and the prefix of every PATH entry, which find_*
# search too. CMAKE_FIND_USE_CMAKE_SYSTEM_PATH=OFF drops the remaining system prefixes.
set(prefixes /usr/local/cuda / /usr /usr/local /opt/cuda /opt/nvidia)
file(GLOB cuda_dirs /usr/local/cuda-*)
list(APPEND prefixes ${cuda_dirs})
if(EXISTS /usr/local/cuda)
  file(REAL_PATH /usr/local/cuda cuda_real)
  list(APPEND prefixes ${cuda_real})
endif()
set(path_entries "$ENV{PATH}")
string(REPLACE ":" ";" path_entries "${path_entries}")
foreach(entry IN LISTS path_entries)
  if(entry)
    cmake_path(SET entry NORMALIZE "${entry}")
    string(REGEX REPLACE "/+$" "" entry "${entry}")
    cmake_path(GET entry PARENT_PATH parent)
    list(APPEND prefixes ${parent})
  endif()
endforeach()
list(REMOVE_DUPLICATES prefixes)
set(ignored)
foreach(prefix IN LISTS prefixes)
  string(REGEX REPLACE "/$" "" prefix "${prefix}")
  foreach(suffix include lib lib64 lib/x86_64-linux-gnu lib/aarch64-linux-gnu)
    list(APPEND ignored ${prefix}/${suffix})
  endforeach()
endforeach()

# A pip-installed nvidia-nccl-cu13 is hidden by an `nvidia` package of our own first on PYTHONPATH
# (a regular package wins over the installed one), which has no `nccl` in it.
file(WRITE ${WORK_DIR}/no_wheel/nvidia/__init__.py "")

# Header with a known version, for machines without a real nccl.h.
function(write_header file major minor patch)
  file(WRITE ${file} "#ifndef NCCL_H_\n#define NCCL_H_\n#define NCCL_MAJOR ${major}\n#define NCCL_MINOR ${minor}\n"
                     "#define NCCL_PATCH ${patch}\n#endif\n")
endfunction()

# configure_case(NAME <case> [PYTHONPATH <dir>] ARGS...): configures the test project with NCCL hidden;
# sets rc and output (stdout and stderr) in the caller's scope.
function(configure_case)
  cmake_parse_arguments(ARG "" "NAME;PYTHONPATH" "" ${ARGN})
  if(NOT ARG_PYTHONPATH)
    set(ARG_PYTHONPATH ${WORK_DIR}/no_wheel)
  endif()
  set(make_program)
  if(MAKE_PROGRAM)
    set(make_program -DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM})
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=NCCL_ROOT --unset=CMAKE_PREFIX_PATH
                          --unset=CMAKE_LIBRARY_PATH --unset=CMAKE_INCLUDE_PATH PYTHONPATH=${ARG_PYTHONPATH}
                          ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/packaging/nccl_config -B ${WORK_DIR}/${ARG_NAME}
                          -G ${GENERATOR} ${make_program} "-DCMAKE_IGNORE_PATH=${ignored}"
                          -DCMAKE_FIND_USE_CMAKE_SYSTEM_PATH=OFF ${ARG_UNPARSED_ARGUMENTS}
                  RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(rc ${result} PARENT_SCOPE)
  set(output "${out}${err}" PARENT_SCOPE)
endfunction()

function(fail what)
  message(FATAL_ERROR "case ${what}\n--- configure printed (exit ${rc}):\n${output}")
endfunction()

function(expect_text what text)
  string(FIND "${output}" "${text}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "case ${what}: missing \"${text}\"\n--- configure printed (exit ${rc}):\n${output}")
  endif()
endfunction()

# a. Nothing to find, default mode: an error that says what is missing and how to opt out.
configure_case(NAME a)
if(rc EQUAL 0)
  fail("a: configure without NCCL must fail (NODAL_NCCL=AUTO in a CUDA build)")
endif()
expect_text("a" "NCCL not found")
expect_text("a" "-DNODAL_NCCL=OFF")
message(STATUS "a. no NCCL, NODAL_NCCL=AUTO: configure fails as it should")

# b. Same, opted out.
configure_case(NAME b -DNODAL_NCCL=OFF)
if(NOT rc EQUAL 0)
  fail("b: NODAL_NCCL=OFF must configure")
endif()
expect_text("b" "nodal: NCCL off (NODAL_NCCL=OFF)")
expect_text("b" "nccl_config: NODAL_WITH_NCCL=OFF ")
message(STATUS "b. no NCCL, NODAL_NCCL=OFF: configures, NCCL off")

# c. NCCL_ROOT with only the versioned library. An empty file stands for it: find_library only looks
# for the name, and the real one is 200 MB.
set(root ${WORK_DIR}/nccl_root)
if(EXISTS /usr/local/cuda/include/nccl.h)
  file(COPY /usr/local/cuda/include/nccl.h DESTINATION ${root}/include)
  file(STRINGS ${root}/include/nccl.h lines REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
  set(version)
  foreach(line IN LISTS lines)
    string(REGEX MATCH "[0-9]+$" number "${line}")
    list(APPEND version ${number})
  endforeach()
  list(JOIN version "." version)
else()
  write_header(${root}/include/nccl.h 2 28 9)
  set(version 2.28.9)
endif()
file(WRITE ${root}/lib/libnccl.so.2 "")
configure_case(NAME c -DNCCL_ROOT=${root})
if(NOT rc EQUAL 0)
  fail("c: NCCL_ROOT with libnccl.so.2 only must configure")
endif()
expect_text("c" "nodal: NCCL ${version} (${root}/lib/libnccl.so.2)")
expect_text("c" "nccl_config: NODAL_WITH_NCCL=ON NCCL_VERSION=${version} target=${root}/lib/libnccl.so.2")
message(STATUS "c. NCCL_ROOT=${root}: NCCL ${version} (${root}/lib/libnccl.so.2)")

# d. The wheel's layout, found through python3 alone; a version of its own so that c cannot pass for it.
find_program(python3 NAMES python3 NO_CACHE)
if(NOT python3)
  message(STATUS "d. skipped: no python3 on PATH, so FindNCCL cannot ask for a wheel here")
else()
  set(site ${WORK_DIR}/site)
  file(WRITE ${site}/nvidia/__init__.py "")
  file(WRITE ${site}/nvidia/nccl/__init__.py "")
  write_header(${site}/nvidia/nccl/include/nccl.h 2 27 3)
  file(WRITE ${site}/nvidia/nccl/lib/libnccl.so.2 "")
  configure_case(NAME d PYTHONPATH ${site})
  if(NOT rc EQUAL 0)
    fail("d: a wheel on PYTHONPATH must configure")
  endif()
  expect_text("d" "nodal: NCCL 2.27.3 (${site}/nvidia/nccl/lib/libnccl.so.2)")
  expect_text("d" "nccl_config: NODAL_WITH_NCCL=ON NCCL_VERSION=2.27.3 target=${site}/nvidia/nccl/lib/libnccl.so.2")
  message(STATUS "d. wheel via ${python3}: NCCL 2.27.3 (${site}/nvidia/nccl/lib/libnccl.so.2)")
endif()

# e. ON promises a GPU build: without CUDA that is an error, not a CPU build.
configure_case(NAME e -DNODAL_NCCL=ON -DWITH_CUDA=OFF)
if(rc EQUAL 0)
  fail("e: NODAL_NCCL=ON without CUDA must fail")
endif()
expect_text("e" "NODAL_NCCL=ON, but this build has no CUDA")
message(STATUS "e. NODAL_NCCL=ON without CUDA: configure fails as it should")
