/* c_api_steps_test.c - the C API's planned steps and statistics, as a C11 program sees them
 * (part of the C API test: c_check.h). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "c_check.h"

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
  CHECK(stats.reserved_bytes == SEGMENT);
  CHECK(stats.free_bytes == SEGMENT - 6144);
  CHECK(stats.largest_free_block == SEGMENT - 6144);
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
  CHECK(stats.segment_splits == 0);
  CHECK(stats.arena_growths == 0);
  CHECK(stats.stitches == 0);
  CHECK(stats.spare_bytes == 0);

  /* Freeing the middle block leaves two free blocks: some fragmentation. */
  CHECK_OK(sdalloc_free(pool, p[1], NULL));
  CHECK_OK(sdalloc_pool_stats(pool, &stats));
  CHECK(stats.live_bytes == 4000);
  CHECK(stats.peak_live_bytes == 6000);
  CHECK(stats.peak_allocated_bytes == 6144);
  CHECK(stats.peak_live_allocations == 3);
  CHECK(stats.frees == 1);
  CHECK(stats.fragmentation > 0.0 && stats.fragmentation < 0.02);
  CHECK(stats.peak_overhead_ratio == (double)SEGMENT / 6000.0);

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

/* A caller built against the first version of the header, whose struct ended at
 * peak_overhead_ratio, gets those fields and nothing written past them. */
static void stats_fill_an_older_callers_shorter_struct(void) {
  g_test = "stats_fill_an_older_callers_shorter_struct";
  sdalloc_pool_t* pool = new_pool(0);
  void* p = NULL;
  CHECK_OK(sdalloc_malloc(pool, 1000, NULL, &p));
  sdalloc_stats_t stats;
  memset(&stats, 0xCD, sizeof stats);
  const size_t first_version = offsetof(sdalloc_stats_t, segment_splits);
  stats.struct_size = first_version;
  CHECK_OK(sdalloc_pool_stats(pool, &stats));
  CHECK(stats.struct_size == first_version);
  CHECK(stats.live_bytes == 1000);
  CHECK(stats.peak_overhead_ratio == (double)SEGMENT / 1000.0);
  const unsigned char* bytes = (const unsigned char*)&stats;
  size_t untouched = 0;
  for (size_t i = first_version; i < sizeof stats; ++i) untouched += bytes[i] == 0xCD;
  CHECK(untouched == sizeof stats - first_version);
  CHECK_OK(sdalloc_free(pool, p, NULL));
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
  CHECK(value == (int64_t)SEGMENT);
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

void run_step_and_stats_tests(void) {
  planned_pool_serves_repeated_steps_from_one_arena();
  planned_pool_search_obeys_its_node_limit();
  planned_pool_keeps_a_plan_per_kind_of_step_in_one_arena();
  step_misuse_and_unplanned_pools_are_invalid_arguments();
  stats_count_live_allocated_and_reserved_bytes();
  stats_require_a_known_struct_size();
  stats_fill_an_older_callers_shorter_struct();
  memory_stat_reads_pytorch_keys();
}
