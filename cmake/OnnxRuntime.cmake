# cmake/OnnxRuntime.cmake - finds ONNX Runtime (the C API only) for the OrtAllocator adapter.
#
# SDALLOC_WITH_ONNXRUNTIME: AUTO (default; on when found), ON (an error when not found), OFF.
# ONNXRUNTIME_ROOT: a folder with include/onnxruntime_c_api.h and lib/libonnxruntime.so;
# default: where scripts/install-deps.sh unpacks ORT 1.29 (${SDALLOC_DEPS:-$HOME/.cache/
# sdalloc}/onnxruntime-1.29.0). Defines the imported target sdalloc::onnxruntime and sets
# SDALLOC_HAVE_ONNXRUNTIME. The core library never depends on it.
set(SDALLOC_WITH_ONNXRUNTIME AUTO CACHE STRING "Build the ONNX Runtime adapter: AUTO, ON or OFF")
set_property(CACHE SDALLOC_WITH_ONNXRUNTIME PROPERTY STRINGS AUTO ON OFF)
if(DEFINED ENV{SDALLOC_DEPS})
  set(_sdalloc_ort_default "$ENV{SDALLOC_DEPS}/onnxruntime-1.29.0")
else()
  set(_sdalloc_ort_default "$ENV{HOME}/.cache/sdalloc/onnxruntime-1.29.0")
endif()
set(ONNXRUNTIME_ROOT "${_sdalloc_ort_default}" CACHE PATH "ONNX Runtime: include/ and lib/")

set(SDALLOC_HAVE_ONNXRUNTIME OFF)
# ThreadSanitizer cannot see the synchronisation inside libonnxruntime.so (not instrumented):
# its thread pool's new/delete pairs read as races in tests that run sessions. The TSan
# build still builds the adapter, and tests/onnxruntime/ then builds only the tests that run
# no session (the adapter called from several threads); the release and ASan builds run all.
if(NOT SDALLOC_WITH_ONNXRUNTIME STREQUAL "OFF")
  find_path(ONNXRUNTIME_INCLUDE_DIR onnxruntime_c_api.h PATHS ${ONNXRUNTIME_ROOT}/include
            NO_DEFAULT_PATH)
  find_library(ONNXRUNTIME_LIBRARY NAMES onnxruntime PATHS ${ONNXRUNTIME_ROOT}/lib
               NO_DEFAULT_PATH)
  if(ONNXRUNTIME_INCLUDE_DIR AND ONNXRUNTIME_LIBRARY)
    set(SDALLOC_HAVE_ONNXRUNTIME ON)
    add_library(sdalloc::onnxruntime SHARED IMPORTED)
    set_target_properties(sdalloc::onnxruntime PROPERTIES
      IMPORTED_LOCATION ${ONNXRUNTIME_LIBRARY}
      INTERFACE_INCLUDE_DIRECTORIES ${ONNXRUNTIME_INCLUDE_DIR})
    message(STATUS "sdalloc: ONNX Runtime adapter on (${ONNXRUNTIME_LIBRARY})")
  elseif(SDALLOC_WITH_ONNXRUNTIME STREQUAL "ON")
    message(FATAL_ERROR "SDALLOC_WITH_ONNXRUNTIME=ON but no ONNX Runtime under "
                        "ONNXRUNTIME_ROOT=${ONNXRUNTIME_ROOT} (run scripts/install-deps.sh)")
  else()
    message(STATUS "sdalloc: ONNX Runtime not found under ${ONNXRUNTIME_ROOT}: adapter off")
  endif()
endif()
