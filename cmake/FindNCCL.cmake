# FindNCCL: NCCL ships no CMake config (nor a pkg-config file), so look for nccl.h and libnccl
# beside the CUDA toolkit (NVIDIA's tarball and the CUDA container put them in
# /usr/local/cuda/{include,lib}; Debian and Ubuntu's libnccl-dev in the system directories) and in
# the PyPI wheel (nvidia-nccl-cu13 and kin: <site-packages>/nvidia/nccl/{include,lib}).
#
# The library may be libnccl.so or only libnccl.so.2: the wheel and runtime-only packages ship no
# unversioned link, and linking by full path needs none.
#
# Hints, in this order: NCCL_ROOT (CMake variable, then environment), CUDAToolkit_LIBRARY_ROOT and
# CUDAToolkit_TARGET_DIR, /usr/local/cuda, the wheel's directory (asked of the python3 on PATH, or
# of NCCL_PYTHON_EXECUTABLE; skipped quietly when there is no python3 or no wheel); then the
# system directories. NCCL_INCLUDE_DIR and NCCL_LIBRARY given on the command line win; they must
# exist.
# Result: NCCL_FOUND, NCCL_VERSION (major.minor.patch from nccl.h), target NCCL::nccl, and
# NCCL_SEARCH_PATHS (the hint directories, for a caller's error message).
set(NCCL_SEARCH_PATHS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_LIBRARY_ROOT} ${CUDAToolkit_TARGET_DIR} /usr/local/cuda)
# Only asked while something is still missing: it costs a Python start on every configure.
if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
  find_program(NCCL_PYTHON_EXECUTABLE NAMES python3)
  mark_as_advanced(NCCL_PYTHON_EXECUTABLE)
  if(NCCL_PYTHON_EXECUTABLE)
    execute_process(COMMAND "${NCCL_PYTHON_EXECUTABLE}" -c "import nvidia.nccl as n; print(list(n.__path__)[0])"
                    RESULT_VARIABLE _nccl_python_result OUTPUT_VARIABLE _nccl_wheel_dir
                    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(_nccl_python_result EQUAL 0 AND IS_DIRECTORY "${_nccl_wheel_dir}")
      list(APPEND NCCL_SEARCH_PATHS "${_nccl_wheel_dir}")
    endif()
  endif()
endif()
list(REMOVE_DUPLICATES NCCL_SEARCH_PATHS)

find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${NCCL_SEARCH_PATHS} PATH_SUFFIXES include)
# NAMES_PER_DIR: both names in each directory before the next one, so that the libnccl.so.2 beside
# the nccl.h just found wins over a libnccl.so further down the list.
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR HINTS ${NCCL_SEARCH_PATHS}
             PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu lib/aarch64-linux-gnu)

# The version doubles as the "usable" check: a path given by hand that is not there leaves it unset
# (find_* take such a path without looking), so NCCL is not found rather than found broken.
unset(NCCL_VERSION)
set(_nccl_reason "")
if(NCCL_LIBRARY AND NOT EXISTS "${NCCL_LIBRARY}")
  string(APPEND _nccl_reason "NCCL_LIBRARY=${NCCL_LIBRARY} does not exist. ")
endif()
if(NCCL_INCLUDE_DIR AND NOT EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  string(APPEND _nccl_reason "NCCL_INCLUDE_DIR=${NCCL_INCLUDE_DIR} holds no nccl.h. ")
endif()
if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY AND NOT _nccl_reason)
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_version_lines REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX REPLACE ".*#define NCCL_${_part} ([0-9]+).*" "\\1" NCCL_VERSION_${_part} "${_nccl_version_lines}")
  endforeach()
  if("${NCCL_VERSION_MAJOR}.${NCCL_VERSION_MINOR}.${NCCL_VERSION_PATCH}" MATCHES "^[0-9]+\\.[0-9]+\\.[0-9]+$")
    set(NCCL_VERSION "${NCCL_VERSION_MAJOR}.${NCCL_VERSION_MINOR}.${NCCL_VERSION_PATCH}")
  else()
    string(APPEND _nccl_reason "${NCCL_INCLUDE_DIR}/nccl.h has no NCCL_MAJOR/MINOR/PATCH. ")
  endif()
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR NCCL_VERSION VERSION_VAR NCCL_VERSION
                                  REASON_FAILURE_MESSAGE "${_nccl_reason}")

if(NCCL_FOUND AND NOT TARGET NCCL::nccl)
  add_library(NCCL::nccl UNKNOWN IMPORTED)
  set_target_properties(NCCL::nccl PROPERTIES IMPORTED_LOCATION "${NCCL_LIBRARY}"
                                              INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
