// planned_arena_limits_test.cpp - PlannedArena with steps too long to plan in time (issue 15,
// finding F5): end_step() gives the plan up instead of stalling, and later steps as long are
// not recorded to the end again.
#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

#include "sdalloc/policies/planned_arena.hpp"
#include "sdalloc/resources/host_resource.hpp"

namespace sdalloc {
namespace {

// A step of `pairs` tiny allocations, each freed before the next.
void run_pairs_step(PlannedArena& arena, std::size_t pairs) {
  arena.begin_step();
  for (std::size_t i = 0; i < pairs; ++i) {
    void* p = arena.allocate(1024);
    ASSERT_NE(p, nullptr);
    arena.deallocate(p, 1024);
  }
  arena.end_step();
}

TEST(PlannedArenaLimits, F5_AStepTooLongToPlanInTimeFallsBack) {
  HostResource host;
  // No planning time: a recording past the planner's first batch of placements (1024
  // buffers) is cut short, and PlannedArena does not adopt such a plan.
  PlannedArenaOptions options;
  options.planner_time_limit_seconds = 0.0;
  PlannedArena arena(host, options);

  run_pairs_step(arena, 3000);
  EXPECT_FALSE(arena.has_plan());
  EXPECT_EQ(arena.counters().unplanned_steps, 1u);
  EXPECT_EQ(arena.counters().recorded_steps, 1u);
  EXPECT_EQ(arena.counters().recorded_allocations, 3000u);
  EXPECT_NO_THROW(arena.check_invariants());

  // A longer step is recorded only as far as the one given up (6000 events: 3000 pairs),
  // then the fallback pool serves the rest of it, and no plan is attempted.
  const std::size_t fallback_before = arena.counters().fallback_allocations;
  run_pairs_step(arena, 4000);
  EXPECT_FALSE(arena.has_plan());
  EXPECT_EQ(arena.counters().unplanned_steps, 2u);
  EXPECT_EQ(arena.counters().recorded_steps, 2u);
  EXPECT_EQ(arena.counters().recorded_allocations, 6000u);
  EXPECT_EQ(arena.counters().fallback_allocations - fallback_before, 1000u);
  EXPECT_EQ(arena.stats().live_bytes, 0u);
  EXPECT_NO_THROW(arena.check_invariants());

  // A step short enough for a whole greedy plan is planned as usual, and then followed.
  run_pairs_step(arena, 100);
  ASSERT_TRUE(arena.has_plan());
  EXPECT_EQ(arena.counters().unplanned_steps, 2u);
  run_pairs_step(arena, 100);
  EXPECT_EQ(arena.counters().planned_allocations, 100u);
  EXPECT_EQ(arena.counters().divergent_steps, 0u);
  EXPECT_NO_THROW(arena.check_invariants());
}

TEST(PlannedArenaLimits, F5_LongStepsOfTinyPairsPlanAsOneSlot) {
  // The greedy placement scanned every placed buffer for each new one (10^5 pairs took
  // most of a second); now this takes milliseconds, and the plan is one slot. The limit is
  // generous only so that a sanitizer build on a loaded machine is never cut short.
  HostResource host;
  PlannedArenaOptions options;
  options.planner_time_limit_seconds = 30.0;
  PlannedArena arena(host, options);
  run_pairs_step(arena, 20000);
  ASSERT_TRUE(arena.has_plan());
  EXPECT_EQ(arena.counters().unplanned_steps, 0u);
  EXPECT_EQ(arena.planned_arena_size(), 1024u);
}

}  // namespace
}  // namespace sdalloc
