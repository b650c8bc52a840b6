/* c_check.h - the C API test's checks (each CHECK counts as one test) and the helpers its
 * files share. The test is one strict C11 program in several files: c_api_test.c (errors,
 * pools, allocation, and main), c_api_steps_test.c (planned steps, statistics),
 * c_api_tensor_test.c (dtypes and tensors). */
#ifndef SDALLOC_TESTS_C_API_C_CHECK_H
#define SDALLOC_TESTS_C_API_C_CHECK_H

#include <stddef.h>
#include <string.h>

#include "sdalloc/sdalloc.h"

extern int g_passed;
extern int g_failed;
extern const char* g_test; /* the running test's name, for the failure lines */
/* The mode new_pool builds: the tests that hold for every pool run once per mode. */
extern sdalloc_pool_mode_t g_mode;

void check_at(int ok, const char* expression, const char* file, int line);
void check_status_at(sdalloc_status_t got, sdalloc_status_t want, const char* call,
                     const char* file, int line);

#define CHECK(expression) check_at((expression) ? 1 : 0, #expression, __FILE__, __LINE__)
#define CHECK_STATUS(want, call) check_status_at((call), (want), #call, __FILE__, __LINE__)
#define CHECK_OK(call) CHECK_STATUS(SDALLOC_SUCCESS, call)
/* The last error mentions `text` (a function name, a field, a key...). */
#define CHECK_MESSAGE(text) CHECK(strstr(sdalloc_last_error(), (text)) != NULL)

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
/* A mode POOL pool's smallest segment (min_segment_size's default). */
#define SEGMENT ((size_t)2 * MIB)
/* A mode VMM pool's page on host memory (64 KiB; the host's 4 KiB granularity is finer). */
#define VM_PAGE ((size_t)64 * KIB)

/* A default pool of mode g_mode with this capacity (0: none); exits when it cannot be made. */
sdalloc_pool_t* new_pool(size_t capacity);
const char* mode_name(sdalloc_pool_mode_t mode);
int is_aligned(const void* ptr, size_t alignment);

/* The other files' tests, in their order. */
void run_step_and_stats_tests(void);
void run_tensor_tests(void);

#endif
