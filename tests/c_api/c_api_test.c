/* c_api_test.c - the C API (sdalloc/sdalloc.h) as a C11 program sees it.
 *
 * Built as strict C11 (no extensions) and linked to the shared library, which is how C
 * callers use sdalloc: this also proves the header is valid C and the symbols are exported.
 * Every function and every documented error path is exercised. Each CHECK counts as one
 * test; the program prints "N passed, M failed" and exits non-zero if any failed. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdalloc/sdalloc.h"

/* ------------------------------------------------------------------ checking */

static int g_passed = 0;
static int g_failed = 0;
static const char* g_test = "";

static void check_at(int ok, const char* expression, const char* file, int line) {
  if (ok) {
    ++g_passed;
    return;
  }
  ++g_failed;
  fprintf(stderr, "%s:%d: %s: CHECK failed: %s\n  last error: \"%s\"\n", file, line, g_test,
          expression, sdalloc_last_error());
}

static void check_status_at(sdalloc_status_t got, sdalloc_status_t want, const char* call,
                            const char* file, int line) {
  if (got == want) {
    ++g_passed;
    return;
  }
  ++g_failed;
  fprintf(stderr, "%s:%d: %s: %s returned %s, expected %s\n  last error: \"%s\"\n", file, line,
          g_test, call, sdalloc_status_string(got), sdalloc_status_string(want),
          sdalloc_last_error());
}

#define CHECK(expression) check_at((expression) ? 1 : 0, #expression, __FILE__, __LINE__)
#define CHECK_STATUS(want, call) check_status_at((call), (want), #call, __FILE__, __LINE__)
#define CHECK_OK(call) CHECK_STATUS(SDALLOC_SUCCESS, call)
/* The last error mentions `text` (a function name, a field, a key...). */
#define CHECK_MESSAGE(text) CHECK(strstr(sdalloc_last_error(), (text)) != NULL)

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
/* A pool below CachingPoolOptions::small_pool_limit (64 MiB) takes segments in multiples of
 * small_granularity (128 KiB), not of the 2 MiB segment granularity. */
#define SMALL_SEGMENT ((size_t)128 * 1024)

static sdalloc_pool_t* new_pool(size_t capacity) {
  sdalloc_pool_config_t config;
  sdalloc_pool_config_init(&config);
  config.capacity = capacity;
  sdalloc_pool_t* pool = NULL;
  CHECK_OK(sdalloc_pool_create(&config, &pool));
  CHECK(pool != NULL);
  if (pool == NULL) {
    fprintf(stderr, "cannot continue without a pool\n");
    exit(1);
  }
  return pool;
}

static int is_aligned(const void* ptr, size_t alignment) { return (uintptr_t)ptr % alignment == 0; }

/* ------------------------------------------------------------------ errors, version */

static void last_error_is_empty_before_any_failure(void) {
  g_test = "last_error_is_empty_before_any_failure";
  CHECK(sdalloc_last_error() != NULL);
  CHECK(strcmp(sdalloc_last_error(), "") == 0);
}

static void version_matches_the_header(void) {
  g_test = "version_matches_the_header";
  CHECK(strcmp(sdalloc_version(), SDALLOC_VERSION_STRING) == 0);
  CHECK(SDALLOC_VERSION_MAJOR >= 0 && SDALLOC_VERSION_MINOR >= 0 && SDALLOC_VERSION_PATCH >= 0);
}

static void every_status_has_a_name(void) {
  g_test = "every_status_has_a_name";
  CHECK(strcmp(sdalloc_status_string(SDALLOC_SUCCESS), "SDALLOC_SUCCESS") == 0);
  CHECK(strcmp(sdalloc_status_string(SDALLOC_ERROR_OUT_OF_MEMORY), "SDALLOC_ERROR_OUT_OF_MEMORY") ==
        0);
  CHECK(strcmp(sdalloc_status_string(SDALLOC_ERROR_INVALID_ARGUMENT),
               "SDALLOC_ERROR_INVALID_ARGUMENT") == 0);
  CHECK(strcmp(sdalloc_status_string(SDALLOC_ERROR_INVALID_POINTER),
               "SDALLOC_ERROR_INVALID_POINTER") == 0);
  CHECK(strcmp(sdalloc_status_string(SDALLOC_ERROR_INTERNAL), "SDALLOC_ERROR_INTERNAL") == 0);
  CHECK(strcmp(sdalloc_status_string((sdalloc_status_t)99), "unknown status") == 0);
}

static void successful_call_keeps_the_last_error(void) {
  g_test = "successful_call_keeps_the_last_error";
  sdalloc_pool_t* pool = new_pool(0);
  void* p = NULL;
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_malloc(pool, 64, NULL, NULL));
  char message[1024];
  snprintf(message, sizeof message, "%s", sdalloc_last_error());
  CHECK(strncmp(message, "sdalloc_malloc: ", 16) == 0);
  CHECK_OK(sdalloc_malloc(pool, 64, NULL, &p));
  CHECK(strcmp(sdalloc_last_error(), message) == 0); /* errno-like: success clears nothing */
  CHECK_OK(sdalloc_free(pool, p, NULL));
  sdalloc_pool_destroy(pool);
}

static void long_messages_are_truncated_not_overflowed(void) {
  g_test = "long_messages_are_truncated_not_overflowed";
  sdalloc_pool_t* pool = new_pool(0);
  static char key[4000];
  memset(key, 'k', sizeof key - 1);
  key[sizeof key - 1] = '\0';
  int64_t value = 1;
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_memory_stat(pool, key, &value));
  CHECK(strlen(sdalloc_last_error()) == 1023);
  CHECK(strncmp(sdalloc_last_error(), "sdalloc_memory_stat: unknown memory stat key 'kkk", 49) ==
        0);
  sdalloc_pool_destroy(pool);
}

/* ------------------------------------------------------------------ pools */

static void config_init_fills_the_defaults(void) {
  g_test = "config_init_fills_the_defaults";
  sdalloc_pool_config_t config;
  memset(&config, 0xAB, sizeof config);
  sdalloc_pool_config_init(&config);
  CHECK(config.struct_size == sizeof(sdalloc_pool_config_t));
  CHECK(config.resource == SDALLOC_RESOURCE_HOST);
  CHECK(config.capacity == 0);
  CHECK(config.initial_reservation == 0);
  CHECK(config.segment_granularity == 2 * MIB);
  CHECK(config.min_segment_size == 2 * MIB);
  CHECK(config.huge_threshold == 8 * MIB);
  CHECK(config.release_cached_before_growth == true);
  CHECK(config.consolidate_when_empty == true);
  CHECK(config.replan_after_divergent_steps == 3);
  CHECK(config.planned == false);
  CHECK(config.max_plans == 4);
  CHECK(config.planner_max_search_nodes == 0);
  sdalloc_pool_config_init(NULL); /* documented no-op: must not crash */
}

static void pool_create_rejects_bad_arguments(void) {
  g_test = "pool_create_rejects_bad_arguments";
  sdalloc_pool_config_t config;
  sdalloc_pool_t* pool = (sdalloc_pool_t*)&config; /* garbage the call must overwrite */

  sdalloc_pool_config_init(&config);
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_pool_create(&config, NULL));
  CHECK_MESSAGE("sdalloc_pool_create: out is NULL");

  config.struct_size = 0; /* as if sdalloc_pool_config_init was never called */
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_pool_create(&config, &pool));
  CHECK(pool == NULL);
  CHECK_MESSAGE("sdalloc_pool_config_init");

  config.struct_size = sizeof config + 64; /* a header newer than the library */
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_pool_create(&config, &pool));
  CHECK_MESSAGE("struct_size");
  CHECK_MESSAGE("newer");

  config.struct_size = 8; /* shorter than any version of the struct */
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_pool_create(&config, &pool));

  sdalloc_pool_config_init(&config);
  config.resource = (sdalloc_resource_kind_t)7;
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_pool_create(&config, &pool));
  CHECK_MESSAGE("unknown resource kind 7");

  sdalloc_pool_config_init(&config);
  config.segment_granularity = 3000; /* not a power of two */
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_pool_create(&config, &pool));
  CHECK(pool == NULL);
  CHECK_MESSAGE("granularity");

  sdalloc_pool_config_init(&config);
  config.min_segment_size = 3 * MIB; /* not a multiple of the 2 MiB granularity */
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_pool_create(&config, &pool));
  CHECK_MESSAGE("min_segment_size");
}

static void pool_create_with_null_config_uses_defaults(void) {
  g_test = "pool_create_with_null_config_uses_defaults";
  sdalloc_pool_t* pool = NULL;
  CHECK_OK(sdalloc_pool_create(NULL, &pool));
  CHECK(pool != NULL);
  void* p = NULL;
  CHECK_OK(sdalloc_malloc(pool, 100, NULL, &p));
  sdalloc_stats_t stats;
  stats.struct_size = sizeof stats;
  CHECK_OK(sdalloc_pool_stats(pool, &stats));
  CHECK(stats.reserved_bytes == SMALL_SEGMENT); /* one segment of a small pool */
  CHECK_OK(sdalloc_free(pool, p, NULL));
  sdalloc_pool_destroy(pool);
  sdalloc_pool_destroy(NULL); /* documented no-op */
}

static void small_pool_limit_zero_takes_min_segment_size_segments(void) {
  g_test = "small_pool_limit_zero_takes_min_segment_size_segments";
  sdalloc_pool_config_t config;
  sdalloc_pool_config_init(&config);
  CHECK(config.small_pool_limit == 64 * MIB);
  CHECK(config.small_granularity == SMALL_SEGMENT);
  config.small_pool_limit = 0;
  sdalloc_pool_t* pool = NULL;
  CHECK_OK(sdalloc_pool_create(&config, &pool));
  void* p = NULL;
  CHECK_OK(sdalloc_malloc(pool, 100, NULL, &p));
  sdalloc_stats_t stats;
  stats.struct_size = sizeof stats;
  CHECK_OK(sdalloc_pool_stats(pool, &stats));
  CHECK(stats.reserved_bytes == 2 * MIB); /* one min_segment_size segment */
  CHECK_OK(sdalloc_free(pool, p, NULL));
  sdalloc_pool_destroy(pool);
  config.small_pool_limit = 64 * MIB;
  config.small_granularity = 100 * 1024; /* not a power of two */
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_pool_create(&config, &pool));
  CHECK_MESSAGE("small_granularity");
}

/* Two 6 MiB blocks freed, then 10 MiB: the two segments are released to grow; with spare
 * pages the 2 MiB the new segment does not need stay held, and once the 10 MiB are freed the
 * next allocation consolidates them into a 12 MiB arena, which a 16 MiB request then grows
 * in place (one segment of 17 MiB). Without either, the 10 MiB segment is the only one (no
 * consolidation) and the 16 MiB request takes a segment beside it (26 MiB). */
static void spare_pages_and_arena_growth_follow_the_config(void) {
  g_test = "spare_pages_and_arena_growth_follow_the_config";
  sdalloc_pool_config_t config;
  sdalloc_pool_config_init(&config);
  CHECK(config.keep_spare_pages);
  CHECK(config.grow_arena);
  config.small_pool_limit = 0;
  config.huge_threshold = 64 * MIB;
  for (int on = 1; on >= 0; --on) {
    config.keep_spare_pages = on != 0;
    config.grow_arena = on != 0;
    sdalloc_pool_t* pool = NULL;
    CHECK_OK(sdalloc_pool_create(&config, &pool));
    void* a = NULL;
    void* b = NULL;
    void* c = NULL;
    void* low = NULL;
    void* big = NULL;
    CHECK_OK(sdalloc_malloc(pool, 6 * MIB, NULL, &a));
    CHECK_OK(sdalloc_malloc(pool, 6 * MIB, NULL, &b));
    CHECK_OK(sdalloc_free(pool, a, NULL));
    CHECK_OK(sdalloc_free(pool, b, NULL));
    CHECK_OK(sdalloc_malloc(pool, 10 * MIB, NULL, &c));
    sdalloc_stats_t stats;
    stats.struct_size = sizeof stats;
    CHECK_OK(sdalloc_pool_stats(pool, &stats));
    CHECK(stats.reserved_bytes == (on ? 12 : 10) * MIB);
    CHECK_OK(sdalloc_free(pool, c, NULL));
    CHECK_OK(sdalloc_malloc(pool, MIB, NULL, &low));
    CHECK_OK(sdalloc_malloc(pool, 16 * MIB, NULL, &big));
    CHECK_OK(sdalloc_pool_stats(pool, &stats));
    CHECK(stats.segments == (on ? 1u : 2u));
    CHECK(stats.reserved_bytes == (on ? 17 : 26) * MIB);
    CHECK_OK(sdalloc_free(pool, big, NULL));
    CHECK_OK(sdalloc_free(pool, low, NULL));
    sdalloc_pool_destroy(pool);
  }
}

static void initial_reservation_is_taken_at_creation_and_kept(void) {
  g_test = "initial_reservation_is_taken_at_creation_and_kept";
  sdalloc_pool_config_t config;
  sdalloc_pool_config_init(&config);
  config.initial_reservation = 8 * MIB;
  sdalloc_pool_t* pool = NULL;
  CHECK_OK(sdalloc_pool_create(&config, &pool));
  sdalloc_stats_t stats;
  stats.struct_size = sizeof stats;
  CHECK_OK(sdalloc_pool_stats(pool, &stats));
  CHECK(stats.reserved_bytes == 8 * MIB);
  size_t released = 1;
  CHECK_OK(sdalloc_trim(pool, &released));
  CHECK(released == 0);
  sdalloc_pool_destroy(pool);

  /* A reservation above the capacity cannot be taken. */
  config.capacity = 4 * MIB;
  pool = (sdalloc_pool_t*)&config;
  CHECK_STATUS(SDALLOC_ERROR_OUT_OF_MEMORY, sdalloc_pool_create(&config, &pool));
  CHECK(pool == NULL);
}

static void hugepage_pool_serves_2mib_aligned_segments(void) {
  g_test = "hugepage_pool_serves_2mib_aligned_segments";
  sdalloc_pool_config_t config;
  sdalloc_pool_config_init(&config);
  config.resource = SDALLOC_RESOURCE_HOST_HUGEPAGES;
  sdalloc_pool_t* pool = NULL;
  CHECK_OK(sdalloc_pool_create(&config, &pool));
  void* p = NULL;
  CHECK_OK(sdalloc_malloc(pool, 4 * MIB, NULL, &p));
  CHECK(p != NULL && is_aligned(p, 2 * MIB)); /* first block of a fresh segment */
  if (p != NULL) memset(p, 0x5A, 4 * MIB);
  CHECK_OK(sdalloc_free(pool, p, NULL));
  sdalloc_pool_destroy(pool);
}

/* ------------------------------------------------------------------ allocation */

static void malloc_returns_aligned_writable_memory(void) {
  g_test = "malloc_returns_aligned_writable_memory";
  sdalloc_pool_t* pool = new_pool(0);
  void* p = NULL;
  CHECK_OK(sdalloc_malloc(pool, 1000, NULL, &p));
  CHECK(p != NULL);
  CHECK(is_aligned(p, 512));
  if (p != NULL) memset(p, 0x11, 1000);
  size_t size = 0;
  CHECK_OK(sdalloc_allocation_size(pool, p, &size));
  CHECK(size == 1000);
  CHECK_OK(sdalloc_free(pool, p, NULL));
  sdalloc_pool_destroy(pool);
}

static void zero_size_malloc_returns_null_and_free_null_is_a_no_op(void) {
  g_test = "zero_size_malloc_returns_null_and_free_null_is_a_no_op";
  sdalloc_pool_t* pool = new_pool(0);
  void* p = &p;
  CHECK_OK(sdalloc_malloc(pool, 0, NULL, &p));
  CHECK(p == NULL);
  CHECK_OK(sdalloc_free(pool, NULL, NULL));
  size_t size = 1;
  CHECK_OK(sdalloc_allocation_size(pool, NULL, &size));
  CHECK(size == 0);
  CHECK_OK(sdalloc_record_stream(pool, NULL, (sdalloc_stream_t)1));
  sdalloc_stats_t stats;
  stats.struct_size = sizeof stats;
  CHECK_OK(sdalloc_pool_stats(pool, &stats));
  CHECK(stats.allocations == 0);
  CHECK(stats.frees == 0);
  sdalloc_pool_destroy(pool);
}

static void null_pool_and_null_out_are_invalid_arguments(void) {
  g_test = "null_pool_and_null_out_are_invalid_arguments";
  sdalloc_pool_t* pool = new_pool(0);
  void* p = &p;
  size_t size = 0;
  int64_t value = 0;
  sdalloc_stats_t stats;
  stats.struct_size = sizeof stats;

  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_malloc(NULL, 64, NULL, &p));
  CHECK(p == NULL); /* out-parameters are cleared on failure */
  CHECK_MESSAGE("sdalloc_malloc: pool is NULL");
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_malloc(pool, 64, NULL, NULL));
  CHECK_MESSAGE("out is NULL");
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_malloc_aligned(NULL, 64, 64, NULL, &p));
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_malloc_aligned(pool, 64, 64, NULL, NULL));
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_free(NULL, NULL, NULL));
  CHECK_MESSAGE("sdalloc_free: pool is NULL");
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_record_stream(NULL, NULL, NULL));
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_allocation_size(NULL, NULL, &size));
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_allocation_size(pool, NULL, NULL));
  CHECK_MESSAGE("size is NULL");
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_trim(NULL, &size));
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_pool_stats(NULL, &stats));
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_pool_stats(pool, NULL));
  CHECK_MESSAGE("stats is NULL");
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_pool_reset_peak(NULL));
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_memory_stat(NULL, "num_ooms", &value));
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_memory_stat(pool, NULL, &value));
  CHECK_MESSAGE("key is NULL");
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_memory_stat(pool, "num_ooms", NULL));
  CHECK_MESSAGE("value is NULL");
  sdalloc_pool_destroy(pool);
}

static void double_free_is_rejected_with_a_message(void) {
  g_test = "double_free_is_rejected_with_a_message";
  sdalloc_pool_t* pool = new_pool(0);
  void* p = NULL;
  CHECK_OK(sdalloc_malloc(pool, 4096, NULL, &p));
  CHECK_OK(sdalloc_free(pool, p, NULL));
  CHECK_STATUS(SDALLOC_ERROR_INVALID_POINTER, sdalloc_free(pool, p, NULL));
  CHECK(strncmp(sdalloc_last_error(), "sdalloc_free: ", 14) == 0);
  CHECK_MESSAGE("double free");
  /* The rejected free changed nothing: the pool still serves and counts correctly. */
  sdalloc_stats_t stats;
  stats.struct_size = sizeof stats;
  CHECK_OK(sdalloc_pool_stats(pool, &stats));
  CHECK(stats.frees == 1);
  CHECK(stats.live_allocations == 0);
  void* q = NULL;
  CHECK_OK(sdalloc_malloc(pool, 4096, NULL, &q));
  CHECK(q == p); /* the freed block is reused on the same stream */
  CHECK_OK(sdalloc_free(pool, q, NULL));
  sdalloc_pool_destroy(pool);
}

static void foreign_and_interior_pointers_are_rejected(void) {
  g_test = "foreign_and_interior_pointers_are_rejected";
  sdalloc_pool_t* pool = new_pool(0);
  sdalloc_pool_t* other = new_pool(0);
  int on_stack = 0;
  void* p = NULL;
  void* theirs = NULL;
  size_t size = 0;
  CHECK_OK(sdalloc_malloc(pool, 8192, NULL, &p));
  CHECK_OK(sdalloc_malloc(other, 8192, NULL, &theirs));

  CHECK_STATUS(SDALLOC_ERROR_INVALID_POINTER, sdalloc_free(pool, &on_stack, NULL));
  CHECK_MESSAGE("never allocated here");
  CHECK_STATUS(SDALLOC_ERROR_INVALID_POINTER, sdalloc_free(pool, theirs, NULL));
  CHECK_STATUS(SDALLOC_ERROR_INVALID_POINTER, sdalloc_free(pool, (char*)p + 512, NULL));
  CHECK_MESSAGE("interior pointer");
  CHECK_STATUS(SDALLOC_ERROR_INVALID_POINTER, sdalloc_allocation_size(pool, theirs, &size));
  CHECK_MESSAGE("sdalloc_allocation_size: ");
  CHECK_STATUS(SDALLOC_ERROR_INVALID_POINTER, sdalloc_record_stream(pool, &on_stack, NULL));
  CHECK_MESSAGE("sdalloc_record_stream: ");

  CHECK_OK(sdalloc_free(pool, p, NULL)); /* p is still live after the rejected frees */
  CHECK_OK(sdalloc_free(other, theirs, NULL));
  sdalloc_pool_destroy(other);
  sdalloc_pool_destroy(pool);
}

static void huge_size_is_out_of_memory(void) {
  g_test = "huge_size_is_out_of_memory";
  sdalloc_pool_t* pool = new_pool(0);
  void* p = &p;
  CHECK_STATUS(SDALLOC_ERROR_OUT_OF_MEMORY, sdalloc_malloc(pool, SIZE_MAX, NULL, &p));
  CHECK(p == NULL);
  CHECK_MESSAGE("sdalloc_malloc: out of memory");
  CHECK_STATUS(SDALLOC_ERROR_OUT_OF_MEMORY,
               sdalloc_malloc_aligned(pool, SIZE_MAX - 4096, 4096, NULL, &p));
  sdalloc_stats_t stats;
  stats.struct_size = sizeof stats;
  CHECK_OK(sdalloc_pool_stats(pool, &stats));
  CHECK(stats.ooms == 2);
  CHECK(stats.reserved_bytes == 0);
  sdalloc_pool_destroy(pool);
}

static void malloc_aligned_honours_alignment_and_rejects_bad_ones(void) {
  g_test = "malloc_aligned_honours_alignment_and_rejects_bad_ones";
  sdalloc_pool_t* pool = new_pool(0);
  void* p = &p;
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_malloc_aligned(pool, 64, 3, NULL, &p));
  CHECK(p == NULL);
  CHECK_MESSAGE("sdalloc_malloc_aligned: ");
  CHECK_MESSAGE("alignment");
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_malloc_aligned(pool, 64, 0, NULL, &p));
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT,
               sdalloc_malloc_aligned(pool, 64, (size_t)1 << 31, NULL, &p)); /* > 1 GiB */

  void* small = NULL;
  void* aligned = NULL;
  CHECK_OK(sdalloc_malloc(pool, 100, NULL, &small)); /* so the next block is not at offset 0 */
  CHECK_OK(sdalloc_malloc_aligned(pool, 1000, 64 * KIB, NULL, &aligned));
  CHECK(aligned != NULL && is_aligned(aligned, 64 * KIB));
  size_t size = 0;
  CHECK_OK(sdalloc_allocation_size(pool, aligned, &size));
  CHECK(size == 1000);
  CHECK_OK(sdalloc_free(pool, aligned, NULL));
  CHECK_OK(sdalloc_free(pool, small, NULL));
  sdalloc_pool_destroy(pool);
}

static void exhausted_capacity_is_out_of_memory_and_the_pool_recovers(void) {
  g_test = "exhausted_capacity_is_out_of_memory_and_the_pool_recovers";
  sdalloc_pool_t* pool = new_pool(16 * MIB);
  void* a = NULL;
  void* b = &b;
  CHECK_OK(sdalloc_malloc(pool, 8 * MIB, NULL, &a));
  CHECK_STATUS(SDALLOC_ERROR_OUT_OF_MEMORY, sdalloc_malloc(pool, 16 * MIB, NULL, &b));
  CHECK(b == NULL);
  CHECK_MESSAGE("sdalloc_malloc: out of memory");
  CHECK_MESSAGE("capacity 16777216 B");

  sdalloc_stats_t stats;
  stats.struct_size = sizeof stats;
  CHECK_OK(sdalloc_pool_stats(pool, &stats));
  CHECK(stats.ooms == 1);
  CHECK(stats.live_bytes == 8 * MIB); /* the failure changed nothing */

  /* What still fits is served; once a is freed the whole capacity is usable again. */
  CHECK_OK(sdalloc_malloc(pool, 4 * MIB, NULL, &b));
  CHECK(b != NULL);
  CHECK_OK(sdalloc_free(pool, b, NULL));
  CHECK_OK(sdalloc_free(pool, a, NULL));
  CHECK_OK(sdalloc_malloc(pool, 16 * MIB, NULL, &b));
  CHECK(b != NULL);
  CHECK_OK(sdalloc_free(pool, b, NULL));

  int64_t ooms = 0;
  CHECK_OK(sdalloc_memory_stat(pool, "num_ooms", &ooms));
  CHECK(ooms == 1);
  sdalloc_pool_destroy(pool);
}

static void record_stream_delays_nothing_on_host_and_frees_normally(void) {
  g_test = "record_stream_delays_nothing_on_host_and_frees_normally";
  sdalloc_pool_t* pool = new_pool(0);
  sdalloc_stream_t side = (sdalloc_stream_t)(uintptr_t)0x1000;
  void* p = NULL;
  CHECK_OK(sdalloc_malloc(pool, 2048, NULL, &p));
  CHECK_OK(sdalloc_record_stream(pool, p, side));
  CHECK_OK(sdalloc_free(pool, p, NULL));
  CHECK_STATUS(SDALLOC_ERROR_INVALID_POINTER, sdalloc_record_stream(pool, p, side));
  sdalloc_stats_t stats;
  stats.struct_size = sizeof stats;
  CHECK_OK(sdalloc_pool_stats(pool, &stats));
  CHECK(stats.pending_free_bytes == 0); /* host streams complete at once */
  CHECK(stats.live_allocations == 0);
  sdalloc_pool_destroy(pool);
}

static void streams_are_separate_shards(void) {
  g_test = "streams_are_separate_shards";
  sdalloc_pool_t* pool = new_pool(0);
  sdalloc_stream_t s1 = (sdalloc_stream_t)(uintptr_t)0x1;
  sdalloc_stream_t s2 = (sdalloc_stream_t)(uintptr_t)0x2;
  void* p = NULL;
  void* q = NULL;
  CHECK_OK(sdalloc_malloc(pool, 4096, s1, &p));
  CHECK_OK(sdalloc_malloc(pool, 4096, s2, &q));
  CHECK(p != q);
  CHECK_OK(sdalloc_free(pool, q, s2));
  CHECK_OK(sdalloc_free(pool, p, s1));
  sdalloc_stats_t stats;
  stats.struct_size = sizeof stats;
  CHECK_OK(sdalloc_pool_stats(pool, &stats));
  CHECK(stats.streams == 2);
  sdalloc_pool_destroy(pool);
}

static void trim_releases_cached_segments(void) {
  g_test = "trim_releases_cached_segments";
  sdalloc_pool_t* pool = new_pool(0);
  void* p = NULL;
  CHECK_OK(sdalloc_malloc(pool, 3 * MIB, NULL, &p));
  CHECK_OK(sdalloc_free(pool, p, NULL));
  sdalloc_stats_t stats;
  stats.struct_size = sizeof stats;
  CHECK_OK(sdalloc_pool_stats(pool, &stats));
  CHECK(stats.reserved_bytes == 3 * MIB); /* cached after the free */
  size_t released = 0;
  CHECK_OK(sdalloc_trim(pool, &released));
  CHECK(released == 3 * MIB);
  CHECK_OK(sdalloc_pool_stats(pool, &stats));
  CHECK(stats.reserved_bytes == 0);
  CHECK(stats.segment_releases == 1);
  CHECK_OK(sdalloc_trim(pool, NULL)); /* released is optional */
  sdalloc_pool_destroy(pool);
}

/* ------------------------------------------------------------------ steps */

static sdalloc_pool_t* new_planned_pool(size_t max_plans) {
  sdalloc_pool_config_t config;
  sdalloc_pool_config_init(&config);
  config.planned = true;
  config.replan_after_divergent_steps = 2;
  config.max_plans = max_plans;
  sdalloc_pool_t* pool = NULL;
  CHECK_OK(sdalloc_pool_create(&config, &pool));
  if (pool == NULL) {
    fprintf(stderr, "cannot continue without a planned pool\n");
    exit(1);
  }
  return pool;
}

/* One step of a loop: two scratch buffers, the second placed where the first was. */
static void run_step(sdalloc_pool_t* pool, size_t first_size, void** first, void** second) {
  CHECK_OK(sdalloc_pool_begin_step(pool, NULL));
  CHECK_OK(sdalloc_malloc(pool, first_size, NULL, first));
  memset(*first, 1, first_size);
  CHECK_OK(sdalloc_free(pool, *first, NULL));
  CHECK_OK(sdalloc_malloc(pool, 64 * KIB, NULL, second));
  memset(*second, 2, 64 * KIB);
  CHECK_OK(sdalloc_free(pool, *second, NULL));
  CHECK_OK(sdalloc_pool_end_step(pool));
}

static void planned_pool_serves_repeated_steps_from_one_arena(void) {
  g_test = "planned_pool_serves_repeated_steps_from_one_arena";
  sdalloc_pool_t* pool = new_planned_pool(1);
  sdalloc_step_stats_t steps;
  memset(&steps, 0xCD, sizeof steps);
  steps.struct_size = sizeof steps;
  CHECK_OK(sdalloc_pool_step_stats(pool, &steps));
  CHECK(!steps.has_plan && !steps.in_step && steps.recorded_steps == 0);

  void* first = NULL;
  void* second = NULL;
  run_step(pool, 64 * KIB, &first, &second); /* recorded */
  void* planned_first = NULL;
  void* planned_second = NULL;
  run_step(pool, 64 * KIB, &planned_first, &planned_second);
  CHECK(planned_first == planned_second); /* one slot: their lifetimes do not meet */
  void* again_first = NULL;
  void* again_second = NULL;
  run_step(pool, 64 * KIB, &again_first, &again_second);
  CHECK(again_first == planned_first);

  CHECK_OK(sdalloc_pool_step_stats(pool, &steps));
  CHECK(steps.has_plan);
  CHECK(steps.arena_bytes == 64 * KIB);
  CHECK(steps.planned_events == 4);
  CHECK(steps.recorded_steps == 1);
  CHECK(steps.planned_steps == 2);
  CHECK(steps.planned_allocations == 4);
  CHECK(steps.recorded_allocations == 2);
  CHECK(steps.divergent_steps == 0);

  /* With one plan at most, another size leaves the plan: served by the caching pool, counted;
   * two in a row replan. */
  run_step(pool, 100 * KIB, &first, &second);
  run_step(pool, 100 * KIB, &first, &second);
  CHECK_OK(sdalloc_pool_step_stats(pool, &steps));
  CHECK(steps.divergent_steps == 2);
  CHECK(steps.replans == 1);
  CHECK(!steps.has_plan);
  run_step(pool, 100 * KIB, &first, &second);
  CHECK_OK(sdalloc_pool_step_stats(pool, &steps));
  CHECK(steps.has_plan && steps.arena_bytes == 100 * KIB && steps.plans == 1);

  sdalloc_stats_t stats;
  stats.struct_size = sizeof stats;
  CHECK_OK(sdalloc_pool_stats(pool, &stats));
  CHECK(stats.live_bytes == 0);
  size_t released = 0;
  CHECK_OK(sdalloc_trim(pool, &released)); /* between steps the arena goes back too */
  CHECK(released >= 100 * KIB);
  sdalloc_pool_destroy(pool);
}

/* A step whose best plan only the planner's search finds (every greedy order needs 10 units,
 * the lower bound is 9; tests/planner/planner_limits_test.cpp, F6), recorded and planned by a
 * pool whose search may visit max_nodes nodes (0: no limit). Returns the arena's bytes. */
static size_t arena_of_a_step_greedy_cannot_pack(size_t max_nodes) {
  enum { kUnit = 64 * KIB };
  /* Buffers 0-5 (sizes in units) and the step's events: + allocates, - frees. */
  static const size_t units[6] = {1, 4, 4, 4, 1, 4};
  static const int events[12] = {+2, +3, +4, -3, -2, +5, +0, -4, +1, -0, -1, -5};
  static const int frees[12] = {0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1, 1};
  sdalloc_pool_config_t config;
  sdalloc_pool_config_init(&config);
  config.planned = true;
  config.planner_max_search_nodes = max_nodes;
  sdalloc_pool_t* pool = NULL;
  CHECK_OK(sdalloc_pool_create(&config, &pool));
  if (pool == NULL) return 0;
  void* live[6] = {NULL};
  CHECK_OK(sdalloc_pool_begin_step(pool, NULL));
  for (int e = 0; e < 12; ++e) {
    const int b = events[e] < 0 ? -events[e] : events[e];
    if (frees[e]) {
      CHECK_OK(sdalloc_free(pool, live[b], NULL));
    } else {
      CHECK_OK(sdalloc_malloc(pool, units[b] * kUnit, NULL, &live[b]));
    }
  }
  CHECK_OK(sdalloc_pool_end_step(pool));
  sdalloc_step_stats_t steps;
  steps.struct_size = sizeof steps;
  CHECK_OK(sdalloc_pool_step_stats(pool, &steps));
  CHECK(steps.has_plan);
  sdalloc_pool_destroy(pool);
  return steps.arena_bytes / kUnit;
}

static void planned_pool_search_obeys_its_node_limit(void) {
  g_test = "planned_pool_search_obeys_its_node_limit";
  CHECK(arena_of_a_step_greedy_cannot_pack(0) == 9);    /* the search finds the bound */
  CHECK(arena_of_a_step_greedy_cannot_pack(1) == 10);   /* stopped at once: greedy's plan */
  CHECK(arena_of_a_step_greedy_cannot_pack(1000) == 9); /* a few nodes are enough */
}

static void planned_pool_keeps_a_plan_per_kind_of_step_in_one_arena(void) {
  g_test = "planned_pool_keeps_a_plan_per_kind_of_step_in_one_arena";
  sdalloc_pool_t* pool = new_planned_pool(4);
  void* first = NULL;
  void* second = NULL;
  for (int round = 0; round < 3; ++round) {
    run_step(pool, 64 * KIB, &first, &second);
    run_step(pool, 100 * KIB, &first, &second);
  }
  sdalloc_step_stats_t steps;
  steps.struct_size = sizeof steps;
  CHECK_OK(sdalloc_pool_step_stats(pool, &steps));
  CHECK(steps.plans == 2);
  CHECK(steps.recorded_steps == 2);
  CHECK(steps.planned_steps == 4);
  CHECK(steps.divergent_steps == 0);
  CHECK(steps.arena_bytes == 100 * KIB); /* shared: the larger plan's size */
  sdalloc_pool_destroy(pool);
}

static void step_misuse_and_unplanned_pools_are_invalid_arguments(void) {
  g_test = "step_misuse_and_unplanned_pools_are_invalid_arguments";
  sdalloc_pool_t* plain = new_pool(0);
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_pool_begin_step(plain, NULL));
  CHECK_MESSAGE("not a planned pool");
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_pool_end_step(plain));
  sdalloc_step_stats_t steps;
  steps.struct_size = sizeof steps;
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_pool_step_stats(plain, &steps));
  sdalloc_pool_destroy(plain);

  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_pool_begin_step(NULL, NULL));
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_pool_end_step(NULL));
  sdalloc_pool_t* pool = new_planned_pool(1);
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_pool_end_step(pool));
  CHECK_MESSAGE("without begin_step");
  CHECK_OK(sdalloc_pool_begin_step(pool, NULL));
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_pool_begin_step(pool, NULL));
  CHECK_MESSAGE("in progress");
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_pool_step_stats(pool, NULL));
  steps.struct_size = 0;
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_pool_step_stats(pool, &steps));
  CHECK_MESSAGE("struct_size");
  steps.struct_size = sizeof steps;
  CHECK_OK(sdalloc_pool_step_stats(pool, &steps));
  CHECK(steps.in_step); /* the failed calls changed nothing */
  void* p = NULL;
  CHECK_OK(sdalloc_malloc(pool, 4 * KIB, NULL, &p));
  size_t size = 0;
  CHECK_OK(sdalloc_allocation_size(pool, p, &size));
  CHECK(size == 4 * KIB);
  CHECK_OK(sdalloc_free(pool, p, NULL));
  CHECK_STATUS(SDALLOC_ERROR_INVALID_POINTER, sdalloc_free(pool, p, NULL)); /* double free */
  CHECK_OK(sdalloc_pool_end_step(pool));
  sdalloc_pool_destroy(pool);

  sdalloc_pool_config_t config;
  sdalloc_pool_config_init(&config);
  config.planned = true;
  config.replan_after_divergent_steps = 0;
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_pool_create(&config, &pool));
  CHECK_MESSAGE("replan_after_divergent_steps");
  CHECK(pool == NULL);
}

/* ------------------------------------------------------------------ statistics */

static void stats_count_live_allocated_and_reserved_bytes(void) {
  g_test = "stats_count_live_allocated_and_reserved_bytes";
  sdalloc_pool_t* pool = new_pool(0);
  void* p[3] = {NULL, NULL, NULL};
  CHECK_OK(sdalloc_malloc(pool, 1000, NULL, &p[0]));
  CHECK_OK(sdalloc_malloc(pool, 2000, NULL, &p[1]));
  CHECK_OK(sdalloc_malloc(pool, 3000, NULL, &p[2]));
  sdalloc_stats_t stats;
  memset(&stats, 0xCD, sizeof stats);
  stats.struct_size = sizeof stats;
  CHECK_OK(sdalloc_pool_stats(pool, &stats));
  CHECK(stats.struct_size == sizeof stats);
  CHECK(stats.live_bytes == 6000);
  CHECK(stats.allocated_bytes == 1024 + 2048 + 3072); /* rounded to 512 B */
  CHECK(stats.reserved_bytes == SMALL_SEGMENT);
  CHECK(stats.free_bytes == SMALL_SEGMENT - 6144);
  CHECK(stats.largest_free_block == SMALL_SEGMENT - 6144);
  CHECK(stats.fragmentation == 0.0); /* the free memory is one block */
  CHECK(stats.live_allocations == 3);
  CHECK(stats.allocations == 3);
  CHECK(stats.frees == 0);
  CHECK(stats.segments == 1);
  CHECK(stats.segment_allocations == 1);
  CHECK(stats.segment_releases == 0);
  CHECK(stats.pending_free_bytes == 0);
  CHECK(stats.ooms == 0);
  CHECK(stats.oom_retries == 0);
  CHECK(stats.streams == 1);

  /* Freeing the middle block leaves two free blocks: some fragmentation. */
  CHECK_OK(sdalloc_free(pool, p[1], NULL));
  CHECK_OK(sdalloc_pool_stats(pool, &stats));
  CHECK(stats.live_bytes == 4000);
  CHECK(stats.peak_live_bytes == 6000);
  CHECK(stats.peak_allocated_bytes == 6144);
  CHECK(stats.peak_live_allocations == 3);
  CHECK(stats.frees == 1);
  CHECK(stats.fragmentation > 0.0 && stats.fragmentation < 0.02);
  CHECK(stats.peak_overhead_ratio == (double)SMALL_SEGMENT / 6000.0);

  CHECK_OK(sdalloc_pool_reset_peak(pool));
  CHECK_OK(sdalloc_pool_stats(pool, &stats));
  CHECK(stats.peak_live_bytes == 4000);
  CHECK(stats.peak_live_allocations == 2);

  CHECK_OK(sdalloc_free(pool, p[0], NULL));
  CHECK_OK(sdalloc_free(pool, p[2], NULL));
  sdalloc_pool_destroy(pool);
}

static void stats_require_a_known_struct_size(void) {
  g_test = "stats_require_a_known_struct_size";
  sdalloc_pool_t* pool = new_pool(0);
  sdalloc_stats_t stats;
  memset(&stats, 0, sizeof stats);
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_pool_stats(pool, &stats));
  CHECK_MESSAGE("sizeof(sdalloc_stats_t)");
  stats.struct_size = sizeof stats + 8;
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_pool_stats(pool, &stats));
  CHECK_MESSAGE("stats->struct_size");
  sdalloc_pool_destroy(pool);
}

static void memory_stat_reads_pytorch_keys(void) {
  g_test = "memory_stat_reads_pytorch_keys";
  sdalloc_pool_t* pool = new_pool(0);
  void* p = NULL;
  CHECK_OK(sdalloc_malloc(pool, 1000, NULL, &p));
  int64_t value = -1;
  CHECK_OK(sdalloc_memory_stat(pool, "allocated_bytes.all.current", &value));
  CHECK(value == 1024);
  CHECK_OK(sdalloc_memory_stat(pool, "requested_bytes.all.current", &value));
  CHECK(value == 1000);
  CHECK_OK(sdalloc_memory_stat(pool, "reserved_bytes.all.peak", &value));
  CHECK(value == (int64_t)SMALL_SEGMENT);
  CHECK_OK(sdalloc_memory_stat(pool, "allocation.all.current", &value));
  CHECK(value == 1);
  CHECK_OK(sdalloc_memory_stat(pool, "num_ooms", &value));
  CHECK(value == 0);

  value = 42;
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT,
               sdalloc_memory_stat(pool, "allocated_bytes.all.bogus", &value));
  CHECK(value == 0);
  CHECK_MESSAGE("unknown memory stat key 'allocated_bytes.all.bogus'");
  CHECK_OK(sdalloc_free(pool, p, NULL));
  sdalloc_pool_destroy(pool);
}

/* ------------------------------------------------------------------ tensors */

static void every_dtype_has_a_width_and_a_name(void) {
  g_test = "every_dtype_has_a_width_and_a_name";
  static const struct {
    sdalloc_dtype_t dtype;
    int32_t bits;
    const char* name;
  } kTable[] = {
      {SDALLOC_DTYPE_FP32, 32, "fp32"},        {SDALLOC_DTYPE_FP16, 16, "fp16"},
      {SDALLOC_DTYPE_BF16, 16, "bf16"},        {SDALLOC_DTYPE_FP8_E4M3, 8, "fp8_e4m3"},
      {SDALLOC_DTYPE_FP8_E5M2, 8, "fp8_e5m2"}, {SDALLOC_DTYPE_INT8, 8, "int8"},
      {SDALLOC_DTYPE_UINT8, 8, "uint8"},       {SDALLOC_DTYPE_INT32, 32, "int32"},
      {SDALLOC_DTYPE_INT64, 64, "int64"},      {SDALLOC_DTYPE_INT4_PACKED, 4, "int4_packed"},
      {SDALLOC_DTYPE_FP64, 64, "fp64"},        {SDALLOC_DTYPE_INT16, 16, "int16"},
      {SDALLOC_DTYPE_BOOL, 8, "bool"},
  };
  for (size_t i = 0; i < sizeof kTable / sizeof kTable[0]; ++i) {
    CHECK(sdalloc_dtype_bits(kTable[i].dtype) == kTable[i].bits);
    CHECK(strcmp(sdalloc_dtype_name(kTable[i].dtype), kTable[i].name) == 0);
  }
  CHECK(sdalloc_dtype_bits((sdalloc_dtype_t)99) == 0);
  CHECK(strcmp(sdalloc_dtype_name((sdalloc_dtype_t)99), "unknown") == 0);
}

static void tensor_nbytes_for_every_dtype(void) {
  g_test = "tensor_nbytes_for_every_dtype";
  const int64_t dims[3] = {2, 3, 5}; /* 30 elements */
  static const struct {
    sdalloc_dtype_t dtype;
    size_t nbytes;
  } kTable[] = {
      {SDALLOC_DTYPE_FP32, 120},       {SDALLOC_DTYPE_FP16, 60},     {SDALLOC_DTYPE_BF16, 60},
      {SDALLOC_DTYPE_FP8_E4M3, 30},    {SDALLOC_DTYPE_FP8_E5M2, 30}, {SDALLOC_DTYPE_INT8, 30},
      {SDALLOC_DTYPE_UINT8, 30},       {SDALLOC_DTYPE_INT32, 120},   {SDALLOC_DTYPE_INT64, 240},
      {SDALLOC_DTYPE_INT4_PACKED, 15}, {SDALLOC_DTYPE_FP64, 240},    {SDALLOC_DTYPE_INT16, 60},
      {SDALLOC_DTYPE_BOOL, 30},
  };
  for (size_t i = 0; i < sizeof kTable / sizeof kTable[0]; ++i) {
    size_t nbytes = 0;
    CHECK_OK(sdalloc_tensor_nbytes(kTable[i].dtype, 3, dims, &nbytes));
    CHECK(nbytes == kTable[i].nbytes);
  }
}

static void packed_int4_rounds_odd_element_counts_up(void) {
  g_test = "packed_int4_rounds_odd_element_counts_up";
  size_t nbytes = 0;
  const int64_t one[1] = {1};
  const int64_t fifteen[2] = {3, 5};
  const int64_t sixteen[2] = {4, 4};
  const int64_t widest[1] = {INT64_MAX};
  CHECK_OK(sdalloc_tensor_nbytes(SDALLOC_DTYPE_INT4_PACKED, 1, one, &nbytes));
  CHECK(nbytes == 1);
  CHECK_OK(sdalloc_tensor_nbytes(SDALLOC_DTYPE_INT4_PACKED, 2, fifteen, &nbytes));
  CHECK(nbytes == 8);
  CHECK_OK(sdalloc_tensor_nbytes(SDALLOC_DTYPE_INT4_PACKED, 2, sixteen, &nbytes));
  CHECK(nbytes == 8);
  CHECK_OK(sdalloc_tensor_nbytes(SDALLOC_DTYPE_INT4_PACKED, 1, widest, &nbytes));
  CHECK(nbytes == (size_t)INT64_MAX / 2 + 1); /* ceil((2^63 - 1) / 2), no overflow */
}

static void scalar_and_empty_shapes_have_sizes(void) {
  g_test = "scalar_and_empty_shapes_have_sizes";
  size_t nbytes = 99;
  CHECK_OK(sdalloc_tensor_nbytes(SDALLOC_DTYPE_FP32, 0, NULL, &nbytes)); /* scalar */
  CHECK(nbytes == 4);
  const int64_t empty[2] = {4, 0};
  CHECK_OK(sdalloc_tensor_nbytes(SDALLOC_DTYPE_FP32, 2, empty, &nbytes));
  CHECK(nbytes == 0);
  /* A 0 dim makes the tensor empty even when the other dims alone would overflow. */
  const int64_t empty_huge[3] = {(int64_t)1 << 40, (int64_t)1 << 40, 0};
  CHECK_OK(sdalloc_tensor_nbytes(SDALLOC_DTYPE_FP32, 3, empty_huge, &nbytes));
  CHECK(nbytes == 0);
  const int64_t eight_dims[SDALLOC_MAX_DIMS] = {2, 2, 2, 2, 2, 2, 2, 2};
  CHECK_OK(sdalloc_tensor_nbytes(SDALLOC_DTYPE_INT8, SDALLOC_MAX_DIMS, eight_dims, &nbytes));
  CHECK(nbytes == 256);
}

static void tensor_nbytes_rejects_bad_shapes(void) {
  g_test = "tensor_nbytes_rejects_bad_shapes";
  const int64_t dims[2] = {4, 4};
  size_t nbytes = 99;

  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT,
               sdalloc_tensor_nbytes((sdalloc_dtype_t)99, 2, dims, &nbytes));
  CHECK(nbytes == 0);
  CHECK_MESSAGE("sdalloc_tensor_nbytes: unknown dtype 99");

  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT,
               sdalloc_tensor_nbytes(SDALLOC_DTYPE_FP32, -1, dims, &nbytes));
  CHECK_MESSAGE("ndim -1 is out of range [0, 8]");
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT,
               sdalloc_tensor_nbytes(SDALLOC_DTYPE_FP32, SDALLOC_MAX_DIMS + 1, dims, &nbytes));
  CHECK_MESSAGE("ndim 9 is out of range");

  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT,
               sdalloc_tensor_nbytes(SDALLOC_DTYPE_FP32, 2, NULL, &nbytes));
  CHECK_MESSAGE("dims is NULL but ndim is 2");

  const int64_t negative[3] = {4, -3, 0};
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT,
               sdalloc_tensor_nbytes(SDALLOC_DTYPE_FP32, 3, negative, &nbytes));
  CHECK_MESSAGE("dims[1] is negative (-3)");

  const int64_t overflow[2] = {(int64_t)1 << 40, (int64_t)1 << 40};
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT,
               sdalloc_tensor_nbytes(SDALLOC_DTYPE_FP32, 2, overflow, &nbytes));
  CHECK_MESSAGE("overflows");
  CHECK_MESSAGE("[1099511627776, 1099511627776]");

  /* The element count fits, the byte count does not (2^62 fp32 = 2^64 bytes)... */
  const int64_t bytes_overflow[1] = {(int64_t)1 << 62};
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT,
               sdalloc_tensor_nbytes(SDALLOC_DTYPE_FP32, 1, bytes_overflow, &nbytes));
  CHECK_MESSAGE("overflows");
  CHECK_MESSAGE("fp32");
  /* ...but 2^62 int8 elements are exactly 2^62 bytes. */
  CHECK_OK(sdalloc_tensor_nbytes(SDALLOC_DTYPE_INT8, 1, bytes_overflow, &nbytes));
  CHECK(nbytes == (size_t)1 << 62);

  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT,
               sdalloc_tensor_nbytes(SDALLOC_DTYPE_FP32, 2, dims, NULL));
  CHECK_MESSAGE("nbytes is NULL");
}

static void tensor_alloc_describes_a_contiguous_tensor(void) {
  g_test = "tensor_alloc_describes_a_contiguous_tensor";
  sdalloc_pool_t* pool = new_pool(0);
  sdalloc_stream_t stream = (sdalloc_stream_t)(uintptr_t)0x7;
  const int64_t dims[4] = {2, 4, 64, 64};
  sdalloc_tensor_t t;
  memset(&t, 0xEE, sizeof t);
  CHECK_OK(sdalloc_tensor_alloc(pool, SDALLOC_DTYPE_FP16, 4, dims, stream, &t));
  CHECK(t.data != NULL && is_aligned(t.data, 512));
  CHECK(t.nbytes == 65536); /* 2 * 4 * 64 * 64 elements of 2 bytes */
  CHECK(t.dtype == SDALLOC_DTYPE_FP16);
  CHECK(t.ndim == 4);
  CHECK(t.dims[0] == 2 && t.dims[1] == 4 && t.dims[2] == 64 && t.dims[3] == 64);
  CHECK(t.strides[0] == 16384 && t.strides[1] == 4096 && t.strides[2] == 64 && t.strides[3] == 1);
  for (int i = 4; i < SDALLOC_MAX_DIMS; ++i) CHECK(t.dims[i] == 0 && t.strides[i] == 0);
  CHECK(t.stream == stream);
  if (t.data != NULL) memset(t.data, 0x3C, t.nbytes);

  size_t size = 0;
  CHECK_OK(sdalloc_allocation_size(pool, t.data, &size));
  CHECK(size == t.nbytes);

  sdalloc_tensor_t stale = t; /* a copy that outlives the free */
  CHECK_OK(sdalloc_tensor_free(pool, &t));
  CHECK(t.data == NULL);
  CHECK(t.nbytes == 0);
  CHECK(t.ndim == 4 && t.dims[3] == 64);   /* the shape is kept */
  CHECK_OK(sdalloc_tensor_free(pool, &t)); /* data NULL: no-op */

  CHECK_STATUS(SDALLOC_ERROR_INVALID_POINTER, sdalloc_tensor_free(pool, &stale));
  CHECK_MESSAGE("sdalloc_tensor_free: ");
  CHECK(stale.data != NULL); /* left unchanged on failure */

  sdalloc_stats_t stats;
  stats.struct_size = sizeof stats;
  CHECK_OK(sdalloc_pool_stats(pool, &stats));
  CHECK(stats.live_allocations == 0);
  CHECK(stats.allocations == 1 && stats.frees == 1);
  sdalloc_pool_destroy(pool);
}

static void tensor_alloc_of_scalar_and_empty_tensors(void) {
  g_test = "tensor_alloc_of_scalar_and_empty_tensors";
  sdalloc_pool_t* pool = new_pool(0);
  sdalloc_tensor_t scalar;
  CHECK_OK(sdalloc_tensor_alloc(pool, SDALLOC_DTYPE_INT64, 0, NULL, NULL, &scalar));
  CHECK(scalar.data != NULL);
  CHECK(scalar.nbytes == 8);
  CHECK(scalar.ndim == 0);
  CHECK_OK(sdalloc_tensor_free(pool, &scalar));

  const int64_t dims[3] = {0, 3, 5};
  sdalloc_tensor_t empty;
  CHECK_OK(sdalloc_tensor_alloc(pool, SDALLOC_DTYPE_FP32, 3, dims, NULL, &empty));
  CHECK(empty.data == NULL);
  CHECK(empty.nbytes == 0);
  CHECK(empty.ndim == 3 && empty.dims[0] == 0 && empty.dims[2] == 5);
  CHECK(empty.strides[0] == 15 && empty.strides[1] == 5 && empty.strides[2] == 1);
  CHECK_OK(sdalloc_tensor_free(pool, &empty));

  sdalloc_stats_t stats;
  stats.struct_size = sizeof stats;
  CHECK_OK(sdalloc_pool_stats(pool, &stats));
  CHECK(stats.allocations == 1); /* the empty tensor took nothing */
  sdalloc_pool_destroy(pool);
}

static void tensor_alloc_failures_leave_a_zeroed_tensor(void) {
  g_test = "tensor_alloc_failures_leave_a_zeroed_tensor";
  sdalloc_pool_t* pool = new_pool(16 * MIB);
  sdalloc_tensor_t t;
  const int64_t overflow[2] = {(int64_t)1 << 40, (int64_t)1 << 40};
  memset(&t, 0xEE, sizeof t);
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT,
               sdalloc_tensor_alloc(pool, SDALLOC_DTYPE_FP32, 2, overflow, NULL, &t));
  CHECK(t.data == NULL && t.nbytes == 0 && t.ndim == 0);
  CHECK_MESSAGE("sdalloc_tensor_alloc: tensor size overflows");
  CHECK_OK(sdalloc_tensor_free(pool, &t)); /* freeing a failed tensor is harmless */

  /* An empty tensor whose strides would not fit in int64_t is refused too. */
  const int64_t empty_overflow[3] = {0, (int64_t)1 << 40, (int64_t)1 << 40};
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT,
               sdalloc_tensor_alloc(pool, SDALLOC_DTYPE_FP32, 3, empty_overflow, NULL, &t));
  CHECK_MESSAGE("strides");

  const int64_t too_big[2] = {1024, 1048576}; /* 4 GiB of fp32 > 16 MiB capacity */
  memset(&t, 0xEE, sizeof t);
  CHECK_STATUS(SDALLOC_ERROR_OUT_OF_MEMORY,
               sdalloc_tensor_alloc(pool, SDALLOC_DTYPE_FP32, 2, too_big, NULL, &t));
  CHECK(t.data == NULL && t.nbytes == 0);
  CHECK_MESSAGE("sdalloc_tensor_alloc: out of memory");

  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT,
               sdalloc_tensor_alloc(pool, (sdalloc_dtype_t)99, 2, overflow, NULL, &t));
  CHECK_MESSAGE("unknown dtype 99");
  const int64_t dims[1] = {16};
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT,
               sdalloc_tensor_alloc(NULL, SDALLOC_DTYPE_FP32, 1, dims, NULL, &t));
  CHECK_MESSAGE("pool is NULL");
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT,
               sdalloc_tensor_alloc(pool, SDALLOC_DTYPE_FP32, 1, dims, NULL, NULL));
  CHECK_MESSAGE("out is NULL");
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_tensor_free(NULL, &t));
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_tensor_free(pool, NULL));
  CHECK_MESSAGE("tensor is NULL");

  /* After all that the pool still serves. */
  CHECK_OK(sdalloc_tensor_alloc(pool, SDALLOC_DTYPE_BF16, 1, dims, NULL, &t));
  CHECK(t.data != NULL && t.nbytes == 32);
  CHECK_OK(sdalloc_tensor_free(pool, &t));
  sdalloc_pool_destroy(pool);
}

int main(void) {
  last_error_is_empty_before_any_failure(); /* must run first */
  version_matches_the_header();
  every_status_has_a_name();
  successful_call_keeps_the_last_error();
  long_messages_are_truncated_not_overflowed();

  config_init_fills_the_defaults();
  pool_create_rejects_bad_arguments();
  pool_create_with_null_config_uses_defaults();
  small_pool_limit_zero_takes_min_segment_size_segments();
  spare_pages_and_arena_growth_follow_the_config();
  initial_reservation_is_taken_at_creation_and_kept();
  hugepage_pool_serves_2mib_aligned_segments();

  malloc_returns_aligned_writable_memory();
  zero_size_malloc_returns_null_and_free_null_is_a_no_op();
  null_pool_and_null_out_are_invalid_arguments();
  double_free_is_rejected_with_a_message();
  foreign_and_interior_pointers_are_rejected();
  huge_size_is_out_of_memory();
  malloc_aligned_honours_alignment_and_rejects_bad_ones();
  exhausted_capacity_is_out_of_memory_and_the_pool_recovers();
  record_stream_delays_nothing_on_host_and_frees_normally();
  streams_are_separate_shards();
  trim_releases_cached_segments();

  planned_pool_serves_repeated_steps_from_one_arena();
  planned_pool_search_obeys_its_node_limit();
  planned_pool_keeps_a_plan_per_kind_of_step_in_one_arena();
  step_misuse_and_unplanned_pools_are_invalid_arguments();

  stats_count_live_allocated_and_reserved_bytes();
  stats_require_a_known_struct_size();
  memory_stat_reads_pytorch_keys();

  every_dtype_has_a_width_and_a_name();
  tensor_nbytes_for_every_dtype();
  packed_int4_rounds_odd_element_counts_up();
  scalar_and_empty_shapes_have_sizes();
  tensor_nbytes_rejects_bad_shapes();
  tensor_alloc_describes_a_contiguous_tensor();
  tensor_alloc_of_scalar_and_empty_tensors();
  tensor_alloc_failures_leave_a_zeroed_tensor();

  printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
