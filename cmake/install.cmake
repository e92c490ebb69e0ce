# Install rules: headers, libmlo.a and libmlo.so.MAJOR, the platform modules
# (LIBDIR/mlo, by src/platform), libmlo-mpi, the tool, mlo.pc, mlo-mpi.pc
# and the CMake package: find_package(mlo) -> mlo::mlo, mlo::mlo_static;
# COMPONENTS mpi -> mlo::mpi, mlo::mpi_static (its own export set, so a
# single-process user's find_package never looks for MPI); COMPONENTS cuda
# opencl -> found when the module is installed (mlo_MODULE_DIR says where).
# libmlo's private requirements are listed in both, so static linking works.
include(CMakePackageConfigHelpers)

get_property(mlo_have_mpi GLOBAL PROPERTY MLO_HAVE_MPI)
get_property(mlo_modules GLOBAL PROPERTY MLO_MODULES)
if(NOT mlo_have_mpi)
  set(mlo_have_mpi OFF)
endif()

install(TARGETS mlo mlo_shared EXPORT mloTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# mlo/mpi.h only with the library that implements it
if(mlo_have_mpi)
  install(DIRECTORY include/mlo DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
else()
  install(DIRECTORY include/mlo DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} PATTERN mpi.h EXCLUDE)
endif()
if(TARGET mlo_cli)
  install(TARGETS mlo_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

set(mlo_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/mlo)
install(EXPORT mloTargets NAMESPACE mlo:: DESTINATION ${mlo_cmake_dir})
if(mlo_have_mpi)
  install(TARGETS mlo_mpi mlo_mpi_shared EXPORT mloMpiTargets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
          INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(EXPORT mloMpiTargets NAMESPACE mlo:: DESTINATION ${mlo_cmake_dir})
endif()
set(MLO_MODULE_DIR_REL ${CMAKE_INSTALL_LIBDIR}/mlo)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/mloConfig.cmake.in
                              ${CMAKE_CURRENT_BINARY_DIR}/mloConfig.cmake
                              INSTALL_DESTINATION ${mlo_cmake_dir}
                              PATH_VARS MLO_MODULE_DIR_REL)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/mloConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/mloConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/mloConfigVersion.cmake DESTINATION ${mlo_cmake_dir})

# mlo.pc: Requires.private and Libs.private are what `pkg-config --static`
# adds for a static link: cJSON, pthreads, libm (and libdl before glibc
# 2.34).  moduledir is where the platform modules are.
set(MLO_PC_REQUIRES_PRIVATE "libcjson")
set(MLO_PC_LIBS_PRIVATE "-lpthread -lm")
if(NOT MLO_DLOPEN_IN_LIBC)
  string(APPEND MLO_PC_LIBS_PRIVATE " ${CMAKE_DL_LIBS}")
endif()
# The prefix relative to the .pc file, so the file stays right wherever the
# tree is installed (lib/, or lib/x86_64-linux-gnu/ under /usr).
file(RELATIVE_PATH MLO_PC_PREFIX_FROM_PCDIR "${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig"
     "${CMAKE_INSTALL_PREFIX}")
string(REGEX REPLACE "/$" "" MLO_PC_PREFIX_FROM_PCDIR "${MLO_PC_PREFIX_FROM_PCDIR}")
configure_file(${CMAKE_CURRENT_LIST_DIR}/mlo.pc.in ${CMAKE_CURRENT_BINARY_DIR}/mlo.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/mlo.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
if(mlo_have_mpi)
  # Open MPI's pkg-config name; another MPI's flags come from its own wrapper
  pkg_check_modules(MLO_OMPI QUIET ompi-c)
  set(MLO_MPI_PC_REQUIRES "mlo")
  set(MLO_MPI_PC_LIBS "")
  if(MLO_OMPI_FOUND)
    string(APPEND MLO_MPI_PC_REQUIRES " ompi-c")
  else()
    foreach(lib ${MPI_C_LIBRARIES})
      string(APPEND MLO_MPI_PC_LIBS " ${lib}")
    endforeach()
  endif()
  configure_file(${CMAKE_CURRENT_LIST_DIR}/mlo-mpi.pc.in ${CMAKE_CURRENT_BINARY_DIR}/mlo-mpi.pc @ONLY)
  install(FILES ${CMAKE_CURRENT_BINARY_DIR}/mlo-mpi.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endif()
