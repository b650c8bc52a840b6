// planned_arena_trace_replay_test.cpp - PlannedArena on every bundled trace
// (data/traces/*.csv, real PyTorch allocation traces), each replayed as three steps.
//
// Through the Pool concept's replay (trace_replay.hpp, which checks the invariants every
// 1024 events): step 1 is recorded, steps 2 and 3 follow its plan. Every allocation of the
// later steps comes from the plan (no fallback, no divergent step), the arena is the plan's
// size, and check_invariants holds after every step. The memory is never touched. The
// second suite does the same over pages (arena_from_fallback).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "conformance/trace_replay.hpp"
#include "sdalloc/policies/any_pool.hpp"
#include "sdalloc/policies/planned_arena.hpp"
#include "sdalloc/policies/virtual_memory_pool.hpp"
#include "sdalloc/resources/host_resource.hpp"
#include "sdalloc/resources/host_virtual_memory.hpp"
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

// The same over pages, as make_pool builds a planned arena where memory is virtual
// (PlannedArenaOptions::arena_from_fallback over a VirtualMemoryPool of 16 KiB pages with no
// growth slack): after the recorded step no step calls the memory; at every event of a
// planned step the memory held stays within 2 % of the most allocated at once; and the
// most ever held, the recording's included, is within half a percent of the trace's peak.
TEST_P(PlannedArenaTraceReplay, OverPagesLaterStepsCallNoMemoryAndHoldWhatIsAllocated) {
  const EventTrace trace = read_event_trace(GetParam());
  HostVirtualMemory memory;
  HostResource unused;
  PlannedArenaOptions options;
  options.arena_from_fallback = true;
  options.planner_max_search_nodes = 10000;
  PlannedArena arena(unused, options, [&memory](MemoryResource&, const CachingPoolOptions&) {
    VirtualMemoryPoolOptions vm;
    vm.page_size = 16 * 1024;
    vm.growth_slack = 0.0;
    return std::make_unique<PoolOf<VirtualMemoryPool>>(memory, vm);
  });
  VirtualMemoryPool& pages = *arena.fallback_pool().vmm();
  const auto memory_calls = [&pages] {
    const VirtualMemoryPoolStats s = pages.vm_stats();
    return s.creates + s.destroys + s.maps + s.unmaps + s.moves;
  };
  arena.begin_step();
  ASSERT_TRUE(replay(trace, arena));
  arena.end_step();
  const std::uint64_t calls = memory_calls();
  std::size_t checked = 0;
  const auto within_allocated = [&] {
    const PoolStats s = arena.stats();
    ++checked;
    ASSERT_LE(static_cast<double>(s.reserved_bytes),
              1.02 * static_cast<double>(s.peak_allocated_bytes))
        << "at event " << checked;
  };
  for (int step = 1; step < 3; ++step) {
    arena.begin_step();
    ASSERT_TRUE(replay(trace, arena, within_allocated)) << "step " << step;
    arena.end_step();
    EXPECT_NO_THROW(arena.check_invariants()) << "after step " << step;
  }
  EXPECT_EQ(memory_calls(), calls) << "a planned step called the memory";
  const PlannedArenaCounters c = arena.counters();
  EXPECT_EQ(c.fallback_allocations, 0u);
  EXPECT_EQ(c.divergent_steps, 0u);
  EXPECT_LE(static_cast<double>(arena.stats().peak_reserved_bytes),
            1.005 * static_cast<double>(trace.peak_live_bytes()));
}

INSTANTIATE_TEST_SUITE_P(BundledTraces, PlannedArenaTraceReplay,
                         ::testing::ValuesIn(bundled_traces()), trace_test_name);

}  // namespace
}  // namespace sdalloc::conformance
