/* c_check.c - the C API test's checks and shared helpers (c_check.h). */
#include "c_check.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int g_passed = 0;
int g_failed = 0;
const char* g_test = "";
sdalloc_pool_mode_t g_mode = SDALLOC_MODE_POOL;

const char* mode_name(sdalloc_pool_mode_t mode) {
  switch (mode) {
    case SDALLOC_MODE_AUTO:
      return "auto";
    case SDALLOC_MODE_POOL:
      return "pool";
    case SDALLOC_MODE_VMM:
      return "vmm";
    case SDALLOC_MODE_PLANNED:
      return "planned";
    case SDALLOC_MODE_ASYNC:
      return "async";
  }
  return "?";
}

void check_at(int ok, const char* expression, const char* file, int line) {
  if (ok) {
    ++g_passed;
    return;
  }
  ++g_failed;
  fprintf(stderr, "%s:%d: %s (mode %s): CHECK failed: %s\n  last error: \"%s\"\n", file, line,
          g_test, mode_name(g_mode), expression, sdalloc_last_error());
}

void check_status_at(sdalloc_status_t got, sdalloc_status_t want, const char* call,
                     const char* file, int line) {
  if (got == want) {
    ++g_passed;
    return;
  }
  ++g_failed;
  fprintf(stderr, "%s:%d: %s (mode %s): %s returned %s, expected %s\n  last error: \"%s\"\n", file,
          line, g_test, mode_name(g_mode), call, sdalloc_status_string(got),
          sdalloc_status_string(want), sdalloc_last_error());
}

sdalloc_pool_t* new_pool(size_t capacity) {
  sdalloc_pool_config_t config;
  sdalloc_pool_config_init(&config);
  config.capacity = capacity;
  config.mode = g_mode;
  sdalloc_pool_t* pool = NULL;
  CHECK_OK(sdalloc_pool_create(&config, &pool));
  CHECK(pool != NULL);
  if (pool == NULL) {
    fprintf(stderr, "cannot continue without a pool\n");
    exit(1);
  }
  return pool;
}

int is_aligned(const void* ptr, size_t alignment) { return (uintptr_t)ptr % alignment == 0; }
