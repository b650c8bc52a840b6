# Install rules: the two libraries, the public headers, a CMake package (sdallocConfig.cmake,
# found with find_package(sdalloc)) and a pkg-config file (sdalloc.pc), so C and C++ users
# can consume an installed sdalloc with either tool. tests/install/check-install.sh proves
# all three work against a fresh prefix.
include(CMakePackageConfigHelpers)

set(SDALLOC_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/sdalloc
    CACHE STRING "Where sdallocConfig.cmake is installed, relative to the prefix")

# The libraries are assembled from $<TARGET_OBJECTS:sdalloc_objects> and do not link the
# object library, so it is not part of their interface and need not be exported. Their
# include directories come from their own $<INSTALL_INTERFACE:include> (src/CMakeLists.txt).
install(TARGETS sdalloc sdalloc_static
  EXPORT sdallocTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime
          NAMELINK_COMPONENT development
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT development
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)

# The CUDA resources (src/cuda), when built: libsdalloc_cuda.a in the same export set, and
# their headers under include/sdalloc/cuda (left out when the library is not built). The
# library's link-only dependency CUDA::cudart_static makes sdallocConfig.cmake look for
# the CUDA toolkit (quietly: consumers that do not link sdalloc_cuda need no toolkit).
set(SDALLOC_PACKAGE_HAS_CUDA OFF)
set(_sdalloc_cuda_headers PATTERN "cuda" EXCLUDE)
if(TARGET sdalloc_cuda)
  install(TARGETS sdalloc_cuda
    EXPORT sdallocTargets
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT development)
  set(SDALLOC_PACKAGE_HAS_CUDA ON)
  set(_sdalloc_cuda_headers)
endif()

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/sdalloc
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT development
  FILES_MATCHING PATTERN "*.hpp" PATTERN "*.h" ${_sdalloc_cuda_headers}
  # The ONNX Runtime and TensorRT adapters are not packaged yet (their libraries are not
  # installed): their headers stay out too.
  PATTERN "onnxruntime" EXCLUDE PATTERN "tensorrt" EXCLUDE)
# The forwarders at the headers' pre-layer paths (<sdalloc/caching_pool.hpp> and the like),
# for one release.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/compat/sdalloc
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT development FILES_MATCHING PATTERN "*.hpp")
install(FILES ${PROJECT_BINARY_DIR}/include/sdalloc/version.hpp
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/sdalloc COMPONENT development)

install(EXPORT sdallocTargets
  NAMESPACE sdalloc::
  FILE sdallocTargets.cmake
  DESTINATION ${SDALLOC_INSTALL_CMAKEDIR} COMPONENT development)

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/sdallocConfig.cmake.in
  ${PROJECT_BINARY_DIR}/sdallocConfig.cmake
  INSTALL_DESTINATION ${SDALLOC_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/sdallocConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/sdallocConfig.cmake
              ${PROJECT_BINARY_DIR}/sdallocConfigVersion.cmake
  DESTINATION ${SDALLOC_INSTALL_CMAKEDIR} COMPONENT development)

# pkg-config: the prefix is found from the .pc file's own place (${pcfiledir}), so the file
# stays right when installed with `cmake --install --prefix DIR` or when the tree is moved.
# Absolute install dirs (set by the user) are written as they are.
set(SDALLOC_PC_DIR ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(SDALLOC_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
  set(SDALLOC_PC_LIBDIR "${CMAKE_INSTALL_FULL_LIBDIR}")
  set(SDALLOC_PC_INCLUDEDIR "${CMAKE_INSTALL_FULL_INCLUDEDIR}")
else()
  file(RELATIVE_PATH _sdalloc_pc_up /_root/${SDALLOC_PC_DIR} /_root)
  string(REGEX REPLACE "/$" "" _sdalloc_pc_up "${_sdalloc_pc_up}")
  set(SDALLOC_PC_PREFIX "\${pcfiledir}/${_sdalloc_pc_up}")
  set(SDALLOC_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
  set(SDALLOC_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/sdalloc.pc.in ${PROJECT_BINARY_DIR}/sdalloc.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/sdalloc.pc
  DESTINATION ${SDALLOC_PC_DIR} COMPONENT development)

# Command-line tools, when built (SDALLOC_BUILD_TOOLS).
if(TARGET sdalloc_cli)
  install(TARGETS sdalloc_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT tools)
endif()

# The PyTorch shim (libsdalloc_torch.so) and the Python package over the C API (pure Python,
# ctypes). The package goes to <libdir>/sdalloc/python/sdalloc and finds the libraries three
# levels up, in <libdir>; put <prefix>/<libdir>/sdalloc/python on PYTHONPATH to import it.
if(TARGET sdalloc_torch)
  install(TARGETS sdalloc_torch LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime)
endif()
# The CPU drop-in (LD_PRELOAD), beside them: sdalloc.preload_path() finds it there.
install(TARGETS sdalloc_preload LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/python/sdalloc
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/sdalloc/python COMPONENT python
  FILES_MATCHING PATTERN "*.py" PATTERN "__pycache__" EXCLUDE)

# The package's _version.py and the Python wheel's component (pyproject.toml).
include(${PROJECT_SOURCE_DIR}/cmake/PythonPackage.cmake)
