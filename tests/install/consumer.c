/* consumer.c - a C11 program built against an installed sdalloc with pkg-config flags
 * (see check-install.sh): gcc -std=c11 -Wall -Wextra -pedantic -Werror.
 *
 * Creates a pool through the C API, allocates, writes, frees, checks that the freed block is
 * handed out again and that a double free is refused with SDALLOC_ERROR_INVALID_POINTER and a
 * message, then destroys the pool. Exits non-zero with the failing step on any surprise. */
#include <sdalloc/sdalloc.h>

#include <stdio.h>
#include <string.h>

static int fail(const char* what, sdalloc_status_t status) {
  fprintf(stderr, "consumer.c: FAILED: %s (%s: %s)\n", what, sdalloc_status_string(status),
          sdalloc_last_error());
  return 1;
}

int main(void) {
  const size_t bytes = (size_t)1 << 20;
  sdalloc_pool_config_t config;
  sdalloc_pool_t* pool = NULL;
  void* first = NULL;
  void* again = NULL;
  sdalloc_status_t status;

  sdalloc_pool_config_init(&config);
  status = sdalloc_pool_create(&config, &pool);
  if (status != SDALLOC_SUCCESS) return fail("sdalloc_pool_create", status);

  status = sdalloc_malloc(pool, bytes, NULL, &first);
  if (status != SDALLOC_SUCCESS || first == NULL) return fail("sdalloc_malloc", status);
  memset(first, 0x5a, bytes);
  status = sdalloc_free(pool, first, NULL);
  if (status != SDALLOC_SUCCESS) return fail("sdalloc_free", status);

  status = sdalloc_malloc(pool, bytes, NULL, &again);
  if (status != SDALLOC_SUCCESS) return fail("sdalloc_malloc (again)", status);
  if (again != first) return fail("the freed block was not reused", status);
  status = sdalloc_free(pool, again, NULL);
  if (status != SDALLOC_SUCCESS) return fail("sdalloc_free (again)", status);

  status = sdalloc_free(pool, again, NULL);
  if (status != SDALLOC_ERROR_INVALID_POINTER) return fail("double free was not refused", status);
  if (sdalloc_last_error()[0] == '\0') return fail("double free left no message", status);

  sdalloc_pool_destroy(pool);
  printf("consumer.c: sdalloc %s (header %s) OK through the C API\n", sdalloc_version(),
         SDALLOC_VERSION_STRING);
  return 0;
}
