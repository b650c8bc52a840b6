# The C API test: a strict C11 program (no extensions, warnings as errors) linked to the
# shared library, the way C callers use sdalloc. Building it proves that sdalloc.h is valid
# C and that every C symbol is exported; running it exercises every function and error path.
add_executable(sdalloc_c_api_test
               ${CMAKE_CURRENT_LIST_DIR}/c_api_test.c ${CMAKE_CURRENT_LIST_DIR}/c_api_steps_test.c
               ${CMAKE_CURRENT_LIST_DIR}/c_api_tensor_test.c ${CMAKE_CURRENT_LIST_DIR}/c_check.c)
target_link_libraries(sdalloc_c_api_test PRIVATE sdalloc)
set_target_properties(sdalloc_c_api_test PROPERTIES C_STANDARD 11 C_STANDARD_REQUIRED ON
                                                    C_EXTENSIONS OFF)
sdalloc_warnings(sdalloc_c_api_test)
target_compile_options(sdalloc_c_api_test PRIVATE -Werror)
add_test(NAME sdalloc_c_api_test COMMAND sdalloc_c_api_test)
set_tests_properties(sdalloc_c_api_test PROPERTIES
                     PASS_REGULAR_EXPRESSION "[0-9]+ passed, 0 failed")
