/* c_api_test.c - the C API (sdalloc/sdalloc.h) as a C11 program sees it.
 *
 * Built as strict C11 (no extensions) and linked to the shared library, which is how C
 * callers use sdalloc: this also proves the header is valid C and the symbols are exported.
 * Every function and every documented error path is exercised, here and in the files
 * c_check.h names. Each CHECK counts as one test; the program prints "N passed, M failed"
 * and exits non-zero if any failed. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "c_check.h"

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
  CHECK(config.mode == SDALLOC_MODE_AUTO);
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

/* With no config, a host pool maps pages (mode AUTO is VMM where memory is virtual): 100
 * bytes hold one 64 KiB page, not a 2 MiB segment. */
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
  CHECK(stats.reserved_bytes == VM_PAGE);
  CHECK_OK(sdalloc_free(pool, p, NULL));
  sdalloc_pool_destroy(pool);
  sdalloc_pool_destroy(NULL); /* documented no-op */
}

/* Creates a pool of `config`, checks that it was built in mode `built`, and answers the bytes
 * it holds for one 100-byte allocation. */
static size_t reserved_after_100_bytes_in(const sdalloc_pool_config_t* config,
                                          sdalloc_pool_mode_t built) {
  sdalloc_pool_t* pool = NULL;
  CHECK_OK(sdalloc_pool_create(config, &pool));
  if (pool == NULL) return 0;
  sdalloc_pool_mode_t mode = SDALLOC_MODE_AUTO;
  CHECK_OK(sdalloc_pool_mode(pool, &mode));
  CHECK(mode == built);
  void* p = NULL;
  CHECK_OK(sdalloc_malloc(pool, 100, NULL, &p));
  sdalloc_stats_t stats;
  stats.struct_size = sizeof stats;
  CHECK_OK(sdalloc_pool_stats(pool, &stats));
  CHECK_OK(sdalloc_free(pool, p, NULL));
  sdalloc_pool_destroy(pool);
  return stats.reserved_bytes;
}

/* mode picks the pool; a caller built against a header without the field (its struct_size
 * ends before it) gets mode POOL, the only pool those versions built. */
static void mode_picks_the_pool_and_older_callers_get_the_segment_cache(void) {
  g_test = "mode_picks_the_pool_and_older_callers_get_the_segment_cache";
  sdalloc_pool_config_t config;
  sdalloc_pool_config_init(&config);
  CHECK(config.mode == SDALLOC_MODE_AUTO);
  CHECK(reserved_after_100_bytes_in(&config, SDALLOC_MODE_VMM) == VM_PAGE);
  config.mode = SDALLOC_MODE_VMM;
  CHECK(reserved_after_100_bytes_in(&config, SDALLOC_MODE_VMM) == VM_PAGE);
  config.mode = SDALLOC_MODE_POOL;
  CHECK(reserved_after_100_bytes_in(&config, SDALLOC_MODE_POOL) == SEGMENT);

  memset(&config, 0xAB, sizeof config);
  sdalloc_pool_config_init_sized(&config, offsetof(sdalloc_pool_config_t, mode));
  CHECK(config.struct_size == offsetof(sdalloc_pool_config_t, mode));
  CHECK(reserved_after_100_bytes_in(&config, SDALLOC_MODE_POOL) == SEGMENT);
  config.planned = true; /* the old way to ask for a planned pool still works */
  sdalloc_pool_t* pool = NULL;
  CHECK_OK(sdalloc_pool_create(&config, &pool));
  sdalloc_pool_mode_t mode = SDALLOC_MODE_AUTO;
  CHECK_OK(sdalloc_pool_mode(pool, &mode));
  CHECK(mode == SDALLOC_MODE_PLANNED);
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_pool_mode(pool, NULL));
  CHECK_MESSAGE("mode is NULL");
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_pool_mode(NULL, &mode));
  CHECK_OK(sdalloc_pool_begin_step(pool, NULL));
  CHECK_OK(sdalloc_pool_end_step(pool));
  sdalloc_pool_destroy(pool);
}

static void bad_modes_are_invalid_arguments(void) {
  g_test = "bad_modes_are_invalid_arguments";
  sdalloc_pool_config_t config;
  sdalloc_pool_t* pool = (sdalloc_pool_t*)&config;
  sdalloc_pool_config_init(&config);
  config.mode = (sdalloc_pool_mode_t)7;
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_pool_create(&config, &pool));
  CHECK(pool == NULL);
  CHECK_MESSAGE("unknown mode 7");

  sdalloc_pool_config_init(&config);
  config.mode = SDALLOC_MODE_VMM;
  config.planned = true; /* two answers to one question */
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_pool_create(&config, &pool));
  CHECK_MESSAGE("config.planned");

  sdalloc_pool_config_init(&config);
  config.mode = SDALLOC_MODE_VMM;
  config.resource = SDALLOC_RESOURCE_HOST_HUGEPAGES; /* whole segments only */
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_pool_create(&config, &pool));
  CHECK_MESSAGE("mode:vmm needs memory that can be mapped page by page");
  config.mode = SDALLOC_MODE_AUTO; /* which picks the segment cache there */
  CHECK(reserved_after_100_bytes_in(&config, SDALLOC_MODE_POOL) == SEGMENT);

  sdalloc_pool_config_init(&config);
  config.mode = SDALLOC_MODE_ASYNC; /* the shim's cudaMallocAsync pools only */
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_pool_create(&config, &pool));
  CHECK_MESSAGE("mode:async needs a stream-ordered allocator");
}

/* The fields retired in 0.2 are accepted, change nothing, and are not checked any more. */
static void retired_fields_are_accepted_and_ignored(void) {
  g_test = "retired_fields_are_accepted_and_ignored";
  sdalloc_pool_config_t config;
  sdalloc_pool_config_init(&config);
  CHECK(config.small_pool_limit == 64 * MIB);
  CHECK(config.small_granularity == 128 * KIB);
  CHECK(config.keep_spare_pages && config.grow_arena && config.cut_free_ends);
  config.mode = SDALLOC_MODE_POOL;
  const size_t by_default = reserved_after_100_bytes_in(&config, SDALLOC_MODE_POOL);
  config.small_pool_limit = 0;
  config.small_granularity = 100 * 1024; /* once refused: not a power of two */
  config.keep_spare_pages = false;
  config.grow_arena = false;
  config.cut_free_ends = false;
  CHECK(reserved_after_100_bytes_in(&config, SDALLOC_MODE_POOL) == by_default);
}

/* Two 6 MiB blocks freed, then 10 MiB. The segment cache releases both segments to take one
 * of 10 MiB; the page pool maps 10 MiB of the pages it holds under the new block and takes
 * nothing new. */
static void a_larger_request_reuses_freed_memory_in_both_modes(void) {
  g_test = "a_larger_request_reuses_freed_memory_in_both_modes";
  const sdalloc_pool_mode_t modes[2] = {SDALLOC_MODE_POOL, SDALLOC_MODE_VMM};
  for (int i = 0; i < 2; ++i) {
    g_mode = modes[i];
    sdalloc_pool_t* pool = new_pool(0);
    void* a = NULL;
    void* b = NULL;
    void* c = NULL;
    CHECK_OK(sdalloc_malloc(pool, 6 * MIB, NULL, &a));
    CHECK_OK(sdalloc_malloc(pool, 6 * MIB, NULL, &b));
    CHECK_OK(sdalloc_free(pool, a, NULL));
    CHECK_OK(sdalloc_free(pool, b, NULL));
    CHECK_OK(sdalloc_malloc(pool, 10 * MIB, NULL, &c));
    if (c != NULL) memset(c, 0x3C, 10 * MIB);
    sdalloc_stats_t stats;
    stats.struct_size = sizeof stats;
    CHECK_OK(sdalloc_pool_stats(pool, &stats));
    CHECK(stats.reserved_bytes == (g_mode == SDALLOC_MODE_POOL ? 10 : 12) * MIB);
    CHECK(stats.peak_reserved_bytes == 12 * MIB);
    CHECK_OK(sdalloc_free(pool, c, NULL));
    sdalloc_pool_destroy(pool);
  }
  g_mode = SDALLOC_MODE_POOL;
}

static void initial_reservation_is_taken_at_creation_and_kept(void) {
  g_test = "initial_reservation_is_taken_at_creation_and_kept";
  sdalloc_pool_config_t config;
  sdalloc_pool_config_init(&config);
  config.mode = SDALLOC_MODE_POOL;
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

static void trim_releases_cached_memory(void) {
  g_test = "trim_releases_cached_memory";
  sdalloc_pool_t* pool = new_pool(0);
  void* p = NULL;
  CHECK_OK(sdalloc_malloc(pool, 3 * MIB, NULL, &p));
  CHECK_OK(sdalloc_free(pool, p, NULL));
  /* A segment is a multiple of 2 MiB; pages are 64 KiB. */
  const size_t held = g_mode == SDALLOC_MODE_POOL ? 4 * MIB : 3 * MIB;
  sdalloc_stats_t stats;
  stats.struct_size = sizeof stats;
  CHECK_OK(sdalloc_pool_stats(pool, &stats));
  CHECK(stats.reserved_bytes == held); /* cached after the free */
  size_t released = 0;
  CHECK_OK(sdalloc_trim(pool, &released));
  CHECK(released == held);
  CHECK_OK(sdalloc_pool_stats(pool, &stats));
  CHECK(stats.reserved_bytes == 0);
  CHECK_OK(sdalloc_trim(pool, NULL)); /* released is optional */
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
  mode_picks_the_pool_and_older_callers_get_the_segment_cache();
  bad_modes_are_invalid_arguments();
  retired_fields_are_accepted_and_ignored();
  a_larger_request_reuses_freed_memory_in_both_modes();
  initial_reservation_is_taken_at_creation_and_kept();
  hugepage_pool_serves_2mib_aligned_segments();

  /* What every pool promises, checked on each pool a host caller can build. */
  const sdalloc_pool_mode_t modes[2] = {SDALLOC_MODE_POOL, SDALLOC_MODE_VMM};
  for (int i = 0; i < 2; ++i) {
    g_mode = modes[i];
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
    trim_releases_cached_memory();
  }
  g_mode = SDALLOC_MODE_POOL;

  run_step_and_stats_tests();
  run_tensor_tests();

  printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
