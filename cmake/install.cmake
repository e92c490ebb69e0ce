# Install rules: headers, libmlo.a and libmlo.so.MAJOR, the tool, mlo.pc and
# the CMake package (find_package(mlo) -> mlo::mlo, mlo::mlo_static).
# Private requirements are listed in both, so static linking works.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

get_property(mlo_have_cuda GLOBAL PROPERTY MLO_HAVE_CUDA)
get_property(mlo_have_opencl GLOBAL PROPERTY MLO_HAVE_OPENCL)
get_property(mlo_have_mpi GLOBAL PROPERTY MLO_HAVE_MPI)
get_property(mlo_have_nccl GLOBAL PROPERTY MLO_HAVE_NCCL)
if(NOT mlo_have_mpi)
  set(mlo_have_mpi OFF)
endif()

install(TARGETS mlo mlo_shared EXPORT mloTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY include/mlo DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(TARGET mlo_cli)
  install(TARGETS mlo_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

set(mlo_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/mlo)
install(EXPORT mloTargets NAMESPACE mlo:: DESTINATION ${mlo_cmake_dir})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/mloConfig.cmake.in
                              ${CMAKE_CURRENT_BINARY_DIR}/mloConfig.cmake
                              INSTALL_DESTINATION ${mlo_cmake_dir})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/mloConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/mloConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/mloConfigVersion.cmake DESTINATION ${mlo_cmake_dir})

# mlo.pc: Requires.private and Libs.private are what `pkg-config --static`
# adds for a static link.
set(MLO_PC_REQUIRES_PRIVATE "libcjson openblas")
set(MLO_PC_LIBS_PRIVATE "-lpthread -lm")
if(mlo_have_opencl)
  string(APPEND MLO_PC_REQUIRES_PRIVATE " OpenCL clblast")
endif()
if(mlo_have_cuda)
  find_package(CUDAToolkit REQUIRED) # src/platform found it; its variables stay there
  string(APPEND MLO_PC_LIBS_PRIVATE " -L${CUDAToolkit_LIBRARY_DIR} -lcublas -lcudart")
  if(mlo_have_nccl)
    string(APPEND MLO_PC_LIBS_PRIVATE " -lnccl")
  endif()
endif()
if(mlo_have_mpi)
  # Open MPI's pkg-config name; another MPI's flags come from its own wrapper
  pkg_check_modules(MLO_OMPI QUIET ompi-c)
  if(MLO_OMPI_FOUND)
    string(APPEND MLO_PC_REQUIRES_PRIVATE " ompi-c")
  else()
    foreach(lib ${MPI_C_LIBRARIES})
      string(APPEND MLO_PC_LIBS_PRIVATE " ${lib}")
    endforeach()
  endif()
endif()
# The prefix relative to the .pc file, so the file stays right wherever the
# tree is installed (lib/, or lib/x86_64-linux-gnu/ under /usr).
file(RELATIVE_PATH MLO_PC_PREFIX_FROM_PCDIR "${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig"
     "${CMAKE_INSTALL_PREFIX}")
string(REGEX REPLACE "/$" "" MLO_PC_PREFIX_FROM_PCDIR "${MLO_PC_PREFIX_FROM_PCDIR}")
configure_file(${CMAKE_CURRENT_LIST_DIR}/mlo.pc.in ${CMAKE_CURRENT_BINARY_DIR}/mlo.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/mlo.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
