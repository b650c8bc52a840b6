// planned_arena_trace_replay_test.cpp - PlannedArena on every bundled trace
// (data/traces/*.csv, real PyTorch allocation traces), each replayed as three steps.
//
// Through the Pool concept's replay (trace_replay.hpp, which checks the invariants every
// 1024 events): step 1 is recorded, steps 2 and 3 follow its plan. Every allocation of the
// later steps comes from the plan (no fallback, no divergent step), the arena is the plan's
// size, and check_invariants holds after every step. The memory is never touched.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "conformance/trace_replay.hpp"
#include "sdalloc/policies/planned_arena.hpp"
#include "sdalloc/resources/host_resource.hpp"
#include "sdalloc/resources/stats_resource.hpp"
#include "sdalloc/trace/event_trace.hpp"

namespace sdalloc::conformance {
namespace {

class PlannedArenaTraceReplay : public ::testing::TestWithParam<std::string> {};

TEST_P(PlannedArenaTraceReplay, LaterStepsAreServedWholeFromThePlan) {
  const EventTrace trace = read_event_trace(GetParam());
  HostResource host;
  StatsResource counted(host);
  PlannedArena arena(counted);
  std::size_t allocations = 0;
  for (const TraceEvent& event : trace.events) allocations += event.op == TraceEvent::Op::kAlloc;
  for (int step = 0; step < 3; ++step) {
    arena.begin_step();
    ASSERT_TRUE(replay(trace, arena)) << "step " << step;
    arena.end_step();
    EXPECT_NO_THROW(arena.check_invariants()) << "after step " << step;
  }
  const PlannedArenaCounters c = arena.counters();
  EXPECT_EQ(c.recorded_allocations, allocations);
  EXPECT_EQ(c.planned_allocations, 2 * allocations);
  EXPECT_EQ(c.fallback_allocations, 0u);
  EXPECT_EQ(c.divergent_steps, 0u);
  EXPECT_TRUE(arena.has_plan());
  EXPECT_EQ(arena.stats().live_bytes, 0u);
  EXPECT_GE(arena.planned_arena_size(), static_cast<std::size_t>(trace.peak_live_bytes()));
}

INSTANTIATE_TEST_SUITE_P(BundledTraces, PlannedArenaTraceReplay,
                         ::testing::ValuesIn(bundled_traces()), trace_test_name);

}  // namespace
}  // namespace sdalloc::conformance
