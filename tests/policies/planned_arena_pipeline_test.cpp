// planned_arena_pipeline_test.cpp - PlannedArena under a real inference loop's habits: state
// carried from one step to the next, frees without a size (the C API, PyTorch), memory
// given back between pipeline stages (trim), other streams using arena memory
// (record_stream), a step on another stream, and a layout that agrees with the statistics.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "conformance/controlled_stream_events.hpp"
#include "sdalloc/core/errors.hpp"
#include "sdalloc/core/pool_layout.hpp"
#include "sdalloc/policies/any_pool.hpp"
#include "sdalloc/policies/planned_arena.hpp"
#include "sdalloc/resources/host_resource.hpp"
#include "sdalloc/resources/limit_resource.hpp"
#include "sdalloc/resources/stats_resource.hpp"
#include "support/layout_checks.hpp"

namespace sdalloc {
namespace {

constexpr std::size_t kKiB = 1024;

// One denoising step: scratch buffers come and go, the next latents are allocated and kept,
// and the previous latents are freed (they came from the step before, or from outside).
void* denoise_step(PlannedArena& arena, void* previous_latents) {
  arena.begin_step();
  void* scratch = arena.allocate(64 * kKiB);
  void* attention = arena.allocate(128 * kKiB);
  arena.free(scratch);
  void* next = arena.allocate(16 * kKiB);
  arena.free(attention);
  arena.free(previous_latents);
  arena.end_step();
  return next;
}

TEST(PlannedArenaPipeline, LatentsCarriedToTheNextStepComeFromThePoolAndStepsStayPlanned) {
  HostResource host;
  PlannedArena arena(host);
  void* latents = arena.allocate(16 * kKiB);  // before the loop: the fallback pool
  for (int step = 0; step < 6; ++step) latents = denoise_step(arena, latents);
  const PlannedArenaCounters c = arena.counters();
  EXPECT_EQ(c.recorded_steps, 1u);
  EXPECT_EQ(c.planned_steps, 5u);
  EXPECT_EQ(c.divergent_steps, 0u);
  EXPECT_EQ(c.planned_allocations, 5u * 2);
  EXPECT_EQ(c.kept_allocations, 5u);
  // The arena holds only what lives within a step: the two scratch buffers.
  EXPECT_EQ(arena.planned_arena_size(), (64 + 128) * kKiB);
  EXPECT_EQ(arena.stats().live_bytes, 16 * kKiB);
  EXPECT_EQ(arena.allocation_size(latents), 16 * kKiB);
  arena.free(latents);
  EXPECT_EQ(arena.stats().live_bytes, 0u);
}

TEST(PlannedArenaPipeline, SizelessFreeAndAllocationSizeCoverEverySource) {
  HostResource host;
  PlannedArena arena(host);
  arena.begin_step();
  void* recorded = arena.allocate(3000);  // direct from the upstream while recording
  EXPECT_EQ(arena.allocation_size(recorded), 3000u);
  arena.free(recorded);
  EXPECT_THROW(arena.allocation_size(recorded), InvalidPointer);
  EXPECT_THROW(arena.free(recorded), InvalidPointer);
  arena.end_step();

  arena.begin_step();
  void* planned = arena.allocate(2900);  // same rounded size: from the arena
  EXPECT_EQ(arena.counters().planned_allocations, 1u);
  EXPECT_EQ(arena.allocation_size(planned), 2900u);
  void* other = arena.allocate(700, Stream(3));  // another stream: the fallback pool
  EXPECT_EQ(arena.allocation_size(other), 700u);
  int on_stack = 0;
  EXPECT_THROW(arena.allocation_size(&on_stack), InvalidPointer);
  EXPECT_THROW(arena.free(&on_stack), InvalidPointer);
  EXPECT_THROW(arena.free(static_cast<char*>(planned) + 512), InvalidPointer);
  arena.free(planned);
  EXPECT_THROW(arena.free(planned), InvalidPointer);
  arena.free(other, Stream(3));
  arena.end_step();
  EXPECT_EQ(arena.counters().divergent_steps, 0u);
  EXPECT_EQ(arena.stats().live_bytes, 0u);
}

TEST(PlannedArenaPipeline, TrimBetweenStepsReturnsTheArenaAndTheNextStepReservesItAgain) {
  HostResource host;
  StatsResource upstream(host);
  PlannedArena arena(upstream);
  void* latents = arena.allocate(16 * kKiB);
  latents = denoise_step(arena, latents);
  latents = denoise_step(arena, latents);
  const std::size_t arena_bytes = arena.planned_arena_size();
  const std::size_t held = upstream.stats().current_bytes;

  arena.begin_step();  // inside a step the arena stays
  EXPECT_LT(arena.trim(), arena_bytes);
  arena.end_step();
  EXPECT_TRUE(arena.has_plan());
  EXPECT_GE(arena.trim(), arena_bytes);
  EXPECT_LE(upstream.stats().current_bytes + arena_bytes, held);
  EXPECT_TRUE(arena.has_plan());  // the plan survives without its memory
  EXPECT_EQ(arena.stats().reserved_bytes, arena.fallback_pool().stats().reserved_bytes);

  const auto planned_before = arena.counters().planned_allocations;
  latents = denoise_step(arena, latents);
  EXPECT_EQ(arena.counters().planned_allocations, planned_before + 2);
  // The empty step (begin, trim, end) above stopped before its recorded events.
  EXPECT_EQ(arena.counters().divergent_steps, 1u);
  EXPECT_EQ(arena.counters().arena_failures, 0u);
  arena.free(latents);
}

// A pipeline that changes shape warms the new one up outside any step (cuDNN's trials), so
// the fallback pool caches that shape's memory, and then records it: the recording, served
// by the upstream, must not hold that cache, nor the idle arena of the old shape, beside it.
TEST(PlannedArenaPipeline, ANewShapeIsRecordedWithoutTheWarmUpsCacheOrTheIdleArena) {
  constexpr std::size_t kMiB = 1024 * kKiB;
  HostResource host;
  StatsResource upstream(host);
  PlannedArena arena(upstream);
  auto step = [&](std::size_t bytes) {
    arena.begin_step();
    void* a = arena.allocate(bytes);
    void* b = arena.allocate(bytes);
    arena.free(a);
    arena.free(b);
    arena.end_step();
  };
  step(kMiB);
  step(kMiB);  // planned: the first shape's arena is reserved
  ASSERT_EQ(arena.counters().planned_allocations, 2u);
  void* w1 = arena.allocate(8 * kMiB);  // the new shape's warm-up, outside any step
  void* w2 = arena.allocate(8 * kMiB);
  arena.free(w1);
  arena.free(w2);
  ASSERT_GE(arena.fallback_pool().stats().reserved_bytes, 16 * kMiB);

  arena.begin_step();
  void* a = arena.allocate(8 * kMiB);  // no plan begins so: recorded
  EXPECT_EQ(arena.fallback_pool().stats().reserved_bytes, 0u) << "the warm-up's cache stayed";
  EXPECT_LT(upstream.stats().current_bytes, 9 * kMiB) << "held beside the recording";
  void* b = arena.allocate(8 * kMiB);
  arena.free(a);
  arena.free(b);
  arena.end_step();
  EXPECT_EQ(arena.counters().recorded_steps, 2u);
  step(8 * kMiB);  // the new shape's plan, in an arena reserved again
  step(kMiB);      // and the old one's still
  EXPECT_EQ(arena.counters().divergent_steps, 0u);
  EXPECT_EQ(arena.counters().planned_allocations, 6u);
  EXPECT_EQ(arena.counters().arena_failures, 0u);
  // The reserved peak is what the arena held at once, not its sources' peaks added up (the
  // old shape's arena, the recording and the new arena never at once); so is the peak count
  // of ranges held (segments, arenas, the recording's blocks).
  EXPECT_EQ(arena.stats().peak_reserved_bytes, upstream.stats().peak_bytes);
  EXPECT_EQ(arena.stats().peak_segments, upstream.stats().peak_count);
}

// The arena a new shape's recording gave back is taken again in that recording's
// end_step(), so the shape's second step, the first it follows, calls the upstream no more
// than any later one.
TEST(PlannedArenaPipeline, ASmallerShapesArenaIsTakenBackInTheStepThatRecordedIt) {
  constexpr std::size_t kMiB = 1024 * kKiB;
  HostResource host;
  StatsResource upstream(host);
  PlannedArena arena(upstream);
  auto step = [&](std::size_t first, std::size_t second) {
    arena.begin_step();
    void* a = arena.allocate(first);
    void* b = arena.allocate(second);
    arena.free(a);
    arena.free(b);
    arena.end_step();
  };
  step(4 * kMiB, 4 * kMiB);
  step(4 * kMiB, 4 * kMiB);
  step(kMiB, kMiB);  // recorded: the idle arena went back for it
  EXPECT_EQ(arena.counters().recorded_steps, 2u);
  EXPECT_GE(arena.stats().reserved_bytes, 8 * kMiB) << "the arena is not back";
  const std::uint64_t calls = upstream.stats().allocations + upstream.stats().deallocations;
  step(kMiB, kMiB);
  step(4 * kMiB, 4 * kMiB);
  EXPECT_EQ(upstream.stats().allocations + upstream.stats().deallocations, calls);
  EXPECT_EQ(arena.counters().planned_steps, 3u);
  EXPECT_EQ(arena.counters().divergent_steps, 0u);
}

TEST(PlannedArenaPipeline, ArenaRefusedAfterTrimDropsThePlanAndTheStepRecords) {
  HostResource host;
  LimitResource limit(host, 8 * 1024 * kKiB);  // room for the fallback pool's 2 MiB segments
  PlannedArena arena(limit);
  void* latents = arena.allocate(16 * kKiB);
  latents = denoise_step(arena, latents);
  ASSERT_TRUE(arena.has_plan());
  arena.trim();
  // Something else takes the memory the arena had.
  const std::size_t hog_bytes = limit.available() - 8 * kKiB;
  void* hog = limit.allocate(hog_bytes);
  arena.begin_step();
  EXPECT_FALSE(arena.has_plan());
  EXPECT_EQ(arena.counters().arena_failures, 1u);
  arena.end_step();  // recorded nothing: no plan, the next step records
  limit.deallocate(hog, hog_bytes);
  latents = denoise_step(arena, latents);
  EXPECT_TRUE(arena.has_plan());
  arena.free(latents);
}

// A PlannedArena whose streams' work completes only when the test says so.
struct ArenaWithControlledStreams : ::testing::Test {
  static PlannedArenaOptions options_with(StreamEvents& events) {
    PlannedArenaOptions options;
    options.fallback.stream_events = &events;
    return options;
  }
  conformance::ControlledStreamEvents events;
  HostResource host;
  PlannedArena arena{host, options_with(events)};
};

TEST_F(ArenaWithControlledStreams, ArenaMemoryUsedByAnotherStreamIsNotReusedBeforeItsWorkIsDone) {
  const auto step = [&](bool share) {
    arena.begin_step();
    void* a = arena.allocate(64 * kKiB);
    if (share) arena.record_stream(a, Stream(9));
    arena.free(a);
    void* b = arena.allocate(64 * kKiB);  // the recording puts b where a was
    arena.free(b);
    arena.end_step();
    return std::pair{a, b};
  };
  step(false);
  const auto [a, b] = step(false);
  EXPECT_EQ(a, b);
  EXPECT_EQ(events.recorded(), 0u);

  const auto [shared, after] = step(true);
  EXPECT_NE(shared, after) << "a slot another stream still uses was handed out again";
  EXPECT_EQ(events.recorded_on(Stream(9)), 1u);
  EXPECT_EQ(arena.counters().divergent_steps, 1u);
  EXPECT_EQ(events.synchronizations(), 0u);
  arena.begin_step();  // the arena is reused from here: waits for stream 9's work
  EXPECT_EQ(events.synchronizations(), 1u);
  arena.end_step();
  EXPECT_EQ(events.unreleased(), 0u);
  EXPECT_EQ(events.misuses(), 0u);
}

TEST(PlannedArenaPipeline, RecordStreamMakesTheStepDivergentOnHostStreamsToo) {
  HostResource host;  // host stream events: nothing to wait for, the same rule
  PlannedArena arena(host);
  void* latents = arena.allocate(16 * kKiB);
  latents = denoise_step(arena, latents);
  arena.begin_step();
  void* scratch = arena.allocate(64 * kKiB);
  arena.record_stream(scratch, Stream(2));
  arena.free(scratch);
  arena.end_step();
  EXPECT_EQ(arena.counters().divergent_steps, 1u);
  latents = denoise_step(arena, latents);  // the plan holds
  EXPECT_EQ(arena.counters().divergent_steps, 1u);
  EXPECT_EQ(arena.counters().planned_allocations, 3u);
  arena.free(latents);
}

TEST_F(ArenaWithControlledStreams, RecordStreamDuringTheRecordingWaitsAtTheFree) {
  arena.begin_step();
  void* a = arena.allocate(8 * kKiB);
  arena.record_stream(a, Stream(4));
  arena.record_stream(a, Stream(4));  // once per stream
  arena.free(a);
  EXPECT_EQ(events.recorded_on(Stream(4)), 1u);
  EXPECT_EQ(events.synchronizations(), 1u);
  arena.end_step();
  int on_stack = 0;
  EXPECT_THROW(arena.record_stream(&on_stack, Stream(4)), InvalidPointer);
  EXPECT_EQ(events.unreleased(), 0u);
}

TEST(PlannedArenaPipeline, AStepOnAnotherStreamDivergesAndEnoughOfThemReplanThere) {
  HostResource host;
  PlannedArena arena(host, PlannedArenaOptions{.replan_after_divergent_steps = 2});
  const auto step = [&](Stream s) {
    arena.begin_step(s);
    void* p = arena.allocate(32 * kKiB, kMinAlignment, s);
    arena.free(p, s);
    arena.end_step();
  };
  step(kDefaultStream);
  EXPECT_EQ(arena.plan_stream(), kDefaultStream);
  step(Stream(5));
  step(Stream(5));
  EXPECT_EQ(arena.counters().divergent_steps, 2u);
  EXPECT_EQ(arena.counters().replans, 1u);
  EXPECT_EQ(arena.counters().planned_allocations, 0u);
  step(Stream(5));  // recorded on stream 5
  EXPECT_EQ(arena.plan_stream(), Stream(5));
  step(Stream(5));
  EXPECT_EQ(arena.counters().planned_allocations, 1u);
  EXPECT_EQ(arena.counters().divergent_steps, 2u);
}

TEST(PlannedArenaPipeline, LayoutTilesArenasDirectBlocksAndPoolSegmentsAndMatchesStats) {
  HostResource host;
  PlannedArena arena(host);
  void* outside = arena.allocate(5000);  // a pool segment
  arena.begin_step();
  void* a = arena.allocate(40 * kKiB);
  void* b = arena.allocate(3000, 4096, kDefaultStream);  // over-aligned: slack in its block
  test::expect_layout_matches_stats(arena);              // recording: direct blocks
  arena.free(a);
  void* c = arena.allocate(20 * kKiB);
  test::expect_layout_matches_stats(arena);  // and one cached for reuse
  arena.free(b);
  arena.free(c);
  arena.end_step();
  test::expect_layout_matches_stats(arena);  // the arena, empty

  arena.begin_step();
  a = arena.allocate(40 * kKiB);
  b = arena.allocate(3000, 4096, kDefaultStream);
  test::expect_layout_matches_stats(arena);  // the arena with live buffers
  arena.free(a);
  c = arena.allocate(20 * kKiB);
  arena.free(b);
  arena.free(c);
  arena.end_step();
  EXPECT_EQ(arena.counters().planned_allocations, 3u);
  arena.free(outside);
  arena.trim();
  test::expect_layout_matches_stats(arena);
  EXPECT_TRUE(arena.layout().segments.empty());
}

// The live peaks are what was live at once, whichever source served it: the fallback pool
// outside steps, the recording's blocks, the arena. Added up, the sources' own peaks said
// three times what this sequence ever had live (on an H200: 17.6 GB for 8.2 GB held).
TEST(PlannedArenaPipeline, LivePeaksAreWhatTheSourcesHeldAtOnce) {
  constexpr std::size_t kMiB = 1024 * kKiB;
  HostResource host;
  PlannedArena arena(host);
  void* warm = arena.allocate(8 * kMiB);  // outside any step: the fallback pool
  arena.free(warm);
  for (int step = 0; step < 2; ++step) {  // recorded, then planned
    arena.begin_step();
    void* a = arena.allocate(4 * kMiB);
    void* b = arena.allocate(4 * kMiB - 100);
    arena.free(a);
    arena.free(b);
    arena.end_step();
  }
  ASSERT_EQ(arena.counters().planned_allocations, 2u);
  const PoolStats s = arena.stats();
  EXPECT_EQ(s.peak_live_bytes, 8 * kMiB);
  EXPECT_EQ(s.peak_allocated_bytes, 8 * kMiB);  // 4 MiB - 100 rounds to 4 MiB
  EXPECT_EQ(s.peak_live_allocations, 2u);
  EXPECT_EQ(s.live_bytes, 0u);
  void* kept = arena.allocate(kMiB);
  EXPECT_EQ(arena.allocation_size(kept), kMiB);
  arena.free(kept);
  EXPECT_THROW(arena.free(kept), InvalidPointer);  // the pool's own error, nothing counted
  EXPECT_EQ(arena.stats().live_allocations, 0u);
  EXPECT_EQ(arena.stats().peak_live_bytes, 8 * kMiB);
}

TEST(PlannedArenaPipeline, ResetPeakBringsPeaksToTheCurrentFigures) {
  HostResource host;
  PlannedArena arena(host);
  void* latents = arena.allocate(16 * kKiB);
  latents = denoise_step(arena, latents);
  latents = denoise_step(arena, latents);
  EXPECT_GT(arena.stats().peak_live_bytes, arena.stats().live_bytes);
  arena.reset_peak();
  const PoolStats s = arena.stats();
  EXPECT_EQ(s.peak_live_bytes, s.live_bytes);
  EXPECT_EQ(s.peak_allocated_bytes, s.allocated_bytes);
  EXPECT_EQ(s.peak_reserved_bytes, s.reserved_bytes);
  arena.free(latents);
}

}  // namespace
}  // namespace sdalloc
