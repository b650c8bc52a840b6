# The Python package's generated module and the wheel's files (pyproject.toml, setup.py).
#
# _version.py carries project(VERSION) to sdalloc.__version__, so the version is written once,
# in CMakeLists.txt. It is installed with the package in both layouts:
#   - `cmake --install` (component python): <libdir>/sdalloc/python/sdalloc, beside the
#     package's modules; the libraries are in <libdir>, the program in <bindir>;
#   - component sdalloc_wheel, left out of a plain `cmake --install` (EXCLUDE_FROM_ALL):
#     setup.py installs it alone with --prefix <the package's folder in the wheel>, so the
#     libraries sit next to the modules and the program in its bin/, where sdalloc._native
#     looks first. Files, not targets: the real file of libsdalloc.so under that name alone
#     (a wheel cannot hold the SONAME links; ctypes loads it by path), and nothing has a
#     build-tree RPATH to strip (the shim, the drop-in and the program link sdalloc
#     statically, the CUDA runtime too: cudart_static).
configure_file(${PROJECT_SOURCE_DIR}/cmake/python_version.py.in
               ${PROJECT_BINARY_DIR}/python/sdalloc/_version.py @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/python/sdalloc/_version.py
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/sdalloc/python/sdalloc COMPONENT python)

install(FILES ${PROJECT_BINARY_DIR}/python/sdalloc/_version.py
  DESTINATION . COMPONENT sdalloc_wheel EXCLUDE_FROM_ALL)
install(FILES $<TARGET_FILE:sdalloc> RENAME libsdalloc.so
  DESTINATION . COMPONENT sdalloc_wheel EXCLUDE_FROM_ALL)
install(FILES $<TARGET_FILE:sdalloc_torch> $<TARGET_FILE:sdalloc_preload>
  DESTINATION . COMPONENT sdalloc_wheel EXCLUDE_FROM_ALL)
if(TARGET sdalloc_cli)
  install(PROGRAMS $<TARGET_FILE:sdalloc_cli>
    DESTINATION bin COMPONENT sdalloc_wheel EXCLUDE_FROM_ALL)
endif()
