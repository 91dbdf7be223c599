# nodal_find_nccl(WITH_CUDA <bool>): whether nodal builds its NCCL backend (the one-rank-per-GPU
# collectives), from the NODAL_NCCL option and whether this build has CUDA:
#   AUTO (default): a CUDA build needs NCCL; it is a configure error when none is found, since a
#                   GPU build quietly without its NCCL backend only shows up at run time, on a GPU
#                   machine. A build without CUDA has no NCCL.
#   ON:             as AUTO, and CUDA itself must be built (for scripts that want a GPU build).
#   OFF:            no NCCL backend, by request.
# Sets NODAL_WITH_NCCL, NCCL_FOUND and NCCL_VERSION in the caller's scope, and target NCCL::nccl in
# the caller's directory. Kept out of CMakeLists.txt so that tests/packaging/check_nccl_config.cmake
# can check it without CUDA.
function(nodal_find_nccl)
  cmake_parse_arguments(PARSE_ARGV 0 ARG "" "WITH_CUDA" "")
  set(NODAL_WITH_NCCL OFF PARENT_SCOPE)

  set(mode AUTO)
  if(DEFINED NODAL_NCCL)
    string(TOUPPER "${NODAL_NCCL}" mode)
  endif()
  if(mode MATCHES "^(ON|YES|TRUE|Y|1)$")
    set(mode ON)
  elseif(mode MATCHES "^(OFF|NO|FALSE|N|0)$")
    set(mode OFF)
  elseif(NOT mode STREQUAL "AUTO")
    message(FATAL_ERROR "NODAL_NCCL is '${NODAL_NCCL}'; it takes AUTO, ON or OFF")
  endif()

  if(mode STREQUAL "OFF")
    message(STATUS "nodal: NCCL off (NODAL_NCCL=OFF): no NCCL backend")
    return()
  endif()
  if(NOT ARG_WITH_CUDA)
    if(mode STREQUAL "ON")
      message(FATAL_ERROR "NODAL_NCCL=ON, but this build has no CUDA (NODAL_CUDA is OFF, or AUTO found no nvcc): "
                          "the NCCL backend needs CUDA. Build with CUDA (NODAL_CUDA=AUTO or ON, with CUDACXX or "
                          "CMAKE_CUDA_COMPILER naming an nvcc if it is not on PATH or in /usr/local/cuda), or drop "
                          "NODAL_NCCL=ON.")
    endif()
    return()
  endif()

  # Our FindNCCL, ahead of any a parent project has on its module path (function scope: local).
  list(PREPEND CMAKE_MODULE_PATH "${CMAKE_CURRENT_FUNCTION_LIST_DIR}")
  find_package(NCCL)
  if(NOT NCCL_FOUND)
    list(JOIN NCCL_SEARCH_PATHS ", " searched)
    message(FATAL_ERROR
            "NCCL not found, and this CUDA build needs it for its NCCL backend (NODAL_NCCL=${mode}).\n"
            "Looked for nccl.h and libnccl.so or libnccl.so.2 under ${searched} (include/, lib/, lib64/; "
            "the directory of a pip-installed nvidia-nccl-cu13 is among them when python3 imports nvidia.nccl), "
            "then in the system directories; now NCCL_INCLUDE_DIR=${NCCL_INCLUDE_DIR}, NCCL_LIBRARY=${NCCL_LIBRARY}.\n"
            "Point at an NCCL with -DNCCL_ROOT=<dir> (or -DNCCL_INCLUDE_DIR=<dir> -DNCCL_LIBRARY=<file>), "
            "or pass -DNODAL_NCCL=OFF to build without the NCCL backend.")
  endif()
  message(STATUS "nodal: NCCL ${NCCL_VERSION} (${NCCL_LIBRARY})")
  set(NODAL_WITH_NCCL ON PARENT_SCOPE)
  set(NCCL_FOUND ${NCCL_FOUND} PARENT_SCOPE)
  set(NCCL_VERSION ${NCCL_VERSION} PARENT_SCOPE)
endfunction()
