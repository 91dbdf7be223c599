# The MPI-program tests (label mpi): tests/programs/mpi_program.c built with each MPI the machine
# has (Debian: mpicc.mpich from libmpich-dev, mpicc.openmpi from libopenmpi-dev) and run under
# nodalrun. A missing wrapper leaves its path empty, and its tests skip saying which package.
find_program(NODAL_MPICC_MPICH mpicc.mpich)
find_program(NODAL_MPICC_OPENMPI mpicc.openmpi)
set(mpi_program_source ${CMAKE_CURRENT_LIST_DIR}/../programs/mpi_program.c)
set(mpi_programs)
foreach(flavour MPICH OPENMPI)
  set(binary "")
  if(NODAL_MPICC_${flavour})
    string(TOLOWER ${flavour} lower)
    set(binary ${CMAKE_CURRENT_BINARY_DIR}/mpi_program_${lower})
    add_custom_command(OUTPUT ${binary}
                       COMMAND ${NODAL_MPICC_${flavour}} -O2 -pthread -o ${binary} ${mpi_program_source}
                       DEPENDS ${mpi_program_source}
                       COMMENT "Building the MPI test program with ${NODAL_MPICC_${flavour}}")
    list(APPEND mpi_programs ${binary})
  endif()
  set(NODAL_MPI_PROGRAM_${flavour} "${binary}")
endforeach()
add_custom_target(mpi_programs DEPENDS ${mpi_programs})

nodal_add_test(mpi_programs_test mpi TIMEOUT 120 integration/mpi_programs_test.cpp)
add_dependencies(mpi_programs_test mpi_programs)
target_compile_definitions(mpi_programs_test PRIVATE NODAL_TEST_MPI_PROGRAM_MPICH="${NODAL_MPI_PROGRAM_MPICH}"
                                                     NODAL_TEST_MPI_PROGRAM_OPENMPI="${NODAL_MPI_PROGRAM_OPENMPI}")
