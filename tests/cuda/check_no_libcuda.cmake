# cmake -DBINARY=<file> -P check_no_libcuda.cmake: fails if BINARY lists libcuda.so (the
# driver library, which machines without an NVIDIA driver lack) among the libraries it needs.
find_program(READELF readelf REQUIRED)
execute_process(COMMAND ${READELF} -d ${BINARY} OUTPUT_VARIABLE dynamic RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "readelf -d ${BINARY} failed (${rc})")
endif()
string(REGEX MATCHALL "\\(NEEDED\\)[^\n]*" needed "${dynamic}")
foreach(entry IN LISTS needed)
  if(entry MATCHES "libcuda\\.so")
    message(FATAL_ERROR "${BINARY} needs libcuda.so: it would not start without a CUDA driver")
  endif()
endforeach()
message(STATUS "${BINARY} needs no libcuda.so: ${needed}")
