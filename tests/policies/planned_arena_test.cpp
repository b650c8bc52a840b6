// planned_arena_test.cpp - PlannedArena: recording, serving by position, divergence, replanning.
#include "sdalloc/policies/planned_arena.hpp"
#include "sdalloc/policies/any_pool.hpp"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/resources/host_resource.hpp"
#include "sdalloc/resources/stats_resource.hpp"
#include "sdalloc/trace/event_trace.hpp"

namespace sdalloc {
namespace {

constexpr std::size_t kKiB = 1024;

// One operation of a step: allocate `size` bytes as buffer `id`, or free buffer `id`.
struct Op {
  bool is_alloc;
  int id;
  std::size_t size = 0;
  friend bool operator==(const Op&, const Op&) = default;
};
Op A(int id, std::size_t size) { return Op{true, id, size}; }
Op F(int id) { return Op{false, id}; }

// Runs one step and returns the pointer of every allocation, by id. Checks as it goes that no
// two live buffers overlap, which is what the arena must never break, and that each buffer
// still holds the mark written into its first and last byte when it is freed.
std::vector<void*> run_step(PlannedArena& arena, const std::vector<Op>& ops) {
  arena.begin_step();
  std::vector<void*> ptrs;
  std::unordered_map<int, std::pair<std::uintptr_t, std::size_t>> live;
  for (const Op& op : ops) {
    if (op.is_alloc) {
      void* p = arena.allocate(op.size);
      const auto begin = reinterpret_cast<std::uintptr_t>(p);
      for (const auto& [id, range] : live) {
        EXPECT_TRUE(begin + op.size <= range.first || range.first + range.second <= begin)
            << "buffer " << op.id << " overlaps live buffer " << id;
      }
      live[op.id] = {begin, op.size};
      static_cast<unsigned char*>(p)[0] = static_cast<unsigned char>(op.id);
      static_cast<unsigned char*>(p)[op.size - 1] = static_cast<unsigned char>(op.id);
      if (ptrs.size() <= static_cast<std::size_t>(op.id)) ptrs.resize(op.id + 1);
      ptrs[static_cast<std::size_t>(op.id)] = p;
    } else {
      auto it = live.find(op.id);
      const auto* bytes = reinterpret_cast<const unsigned char*>(it->second.first);
      EXPECT_EQ(bytes[0], static_cast<unsigned char>(op.id)) << "buffer " << op.id;
      EXPECT_EQ(bytes[it->second.second - 1], static_cast<unsigned char>(op.id));
      arena.deallocate(reinterpret_cast<void*>(it->second.first), it->second.second);
      live.erase(it);
    }
  }
  arena.end_step();
  return ptrs;
}

const std::vector<Op> kLoop = {
    A(0, 64 * kKiB), A(1, 32 * kKiB), F(0), A(2, 48 * kKiB), A(3, 1000), F(1), F(3), F(2)};

bool inside(const void* p, const void* base, std::size_t size) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  const auto b = reinterpret_cast<std::uintptr_t>(base);
  return a >= b && a < b + size;
}

TEST(PlannedArena, RecordedLoopIsServedFromTheArenaAtTheRecordedOffsets) {
  HostResource host;
  StatsResource upstream(host);
  PlannedArena arena(upstream);
  run_step(arena, kLoop);
  ASSERT_TRUE(arena.has_plan());
  EXPECT_EQ(arena.planned_events(), kLoop.size());
  const std::vector<void*> second = run_step(arena, kLoop);
  const auto upstream_calls = upstream.stats().allocations;
  const std::vector<void*> third = run_step(arena, kLoop);
  EXPECT_EQ(second, third);
  EXPECT_EQ(upstream.stats().allocations, upstream_calls);
  // The plan reuses memory: 0 is freed before 2 and 3 are allocated.
  EXPECT_LT(arena.planned_arena_size(), (64 + 32 + 48) * kKiB + 1024);
  const PlannedArenaCounters c = arena.counters();
  EXPECT_EQ(c.planned_allocations, 8u);
  EXPECT_EQ(c.recorded_allocations, 4u);
  EXPECT_EQ(c.fallback_allocations, 0u);  // the recording came from the upstream itself
  EXPECT_EQ(c.divergent_steps, 0u);
  EXPECT_EQ(c.planned_steps, 2u);
  const PoolStats s = arena.stats();
  EXPECT_EQ(s.live_bytes, 0u);
  EXPECT_EQ(s.allocations, 12u);
  EXPECT_EQ(s.frees, 12u);
  EXPECT_GE(s.reserved_bytes, arena.planned_arena_size());
}

// The recording takes blocks from the upstream, reuses a freed block for a request of
// exactly its size, and returns kept blocks before the upstream would hold more than the
// step had live at once.
TEST(PlannedArena, RecordingReusesExactSizesAndHoldsNoMoreThanItsLivePeak) {
  HostResource host;
  StatsResource upstream(host);
  PlannedArena arena(upstream);
  const std::vector<Op> step = {
      A(0, 64 * kKiB), F(0), A(1, 64 * kKiB), F(1), A(2, 32 * kKiB), A(3, 16 * kKiB), F(2), F(3)};
  run_step(arena, step);
  // 0 and 1 share one block; 2 does not fit the kept 64 KiB under the 64 KiB peak, so that
  // block goes back first; 3 is new. Then the arena of the plan (64 KiB at most).
  const ResourceStats s = upstream.stats();
  EXPECT_EQ(s.allocations, 3u + 1u);
  EXPECT_EQ(arena.counters().recorded_allocations, 4u);
  // Each block has room to align its 512-byte rounding on the upstream's 256-byte guarantee.
  const std::size_t slack = CachingPool::kRounding - kMinAlignment;
  EXPECT_EQ(s.peak_bytes, 64 * kKiB + slack);
  EXPECT_EQ(s.current_bytes, arena.stats().reserved_bytes);
  EXPECT_LE(arena.planned_arena_size(), 64 * kKiB);
  EXPECT_EQ(arena.stats().segments, 1u);  // the kept blocks went back at end_step()
}

// prefault_host_arena: the arena's pages are resident as soon as the plan exists.
TEST(PlannedArena, PrefaultedHostArenaIsResidentBeforeTheFirstPlannedStep) {
  HostResource host;
  PlannedArenaOptions options;
  options.prefault_host_arena = true;
  PlannedArena arena(host, options);
  run_step(arena, kLoop);
  ASSERT_TRUE(arena.has_plan());
  EXPECT_EQ(arena.counters().prefault_failures, 0u);
  arena.begin_step();
  void* p = arena.allocate(64 * kKiB);  // slot 0, planned: inside the arena
  const std::size_t page = HostResource::kPageSize;
  const auto base = reinterpret_cast<std::uintptr_t>(p) / page * page;
  std::vector<unsigned char> resident(64 * kKiB / page);
  ASSERT_EQ(::mincore(reinterpret_cast<void*>(base), 64 * kKiB, resident.data()), 0);
  for (unsigned char r : resident) EXPECT_EQ(r & 1, 1);
  arena.deallocate(p, 64 * kKiB);
  arena.end_step();
}

TEST(PlannedArena, LiveFiguresCountArenaAllocations) {
  HostResource host;
  PlannedArena arena(host);
  run_step(arena, kLoop);
  arena.begin_step();
  void* p = arena.allocate(64 * kKiB);
  const PoolStats s = arena.stats();
  EXPECT_EQ(s.live_bytes, 64 * kKiB);
  EXPECT_EQ(s.live_allocations, 1u);
  EXPECT_EQ(arena.counters().planned_allocations, 1u);
  arena.deallocate(p, 64 * kKiB);
  EXPECT_EQ(arena.stats().live_bytes, 0u);
  arena.end_step();  // stopped early: divergent
  EXPECT_EQ(arena.counters().divergent_steps, 1u);
}

TEST(PlannedArena, DifferentSizeFallsBackAndIsCounted) {
  HostResource host;
  PlannedArena arena(host);
  run_step(arena, kLoop);
  const std::vector<void*> planned = run_step(arena, kLoop);
  std::vector<Op> changed = kLoop;
  changed[1].size = 40 * kKiB;  // a new shape
  const std::vector<void*> ptrs = run_step(arena, changed);
  EXPECT_EQ(ptrs[0], planned[0]);  // before the divergence the plan still serves
  for (int id : {1, 2, 3}) EXPECT_NE(ptrs[static_cast<std::size_t>(id)], planned[id]);
  const PlannedArenaCounters c = arena.counters();
  EXPECT_EQ(c.divergent_steps, 1u);
  EXPECT_EQ(c.planned_allocations, 4u + 1u);
  EXPECT_EQ(c.fallback_allocations, 3u);
  EXPECT_TRUE(arena.has_plan());
  EXPECT_EQ(run_step(arena, kLoop), planned);  // the next regular step follows the plan again
  EXPECT_EQ(arena.counters().divergent_steps, 1u);
}

TEST(PlannedArena, ExtraAllocationFallsBackAndIsCounted) {
  HostResource host;
  PlannedArena arena(host);
  run_step(arena, kLoop);
  std::vector<Op> extra = kLoop;
  extra.insert(extra.begin() + 2, A(9, 8 * kKiB));
  extra.push_back(F(9));
  run_step(arena, extra);
  const PlannedArenaCounters c = arena.counters();
  EXPECT_EQ(c.divergent_steps, 1u);
  EXPECT_EQ(c.planned_allocations, 2u);   // 0 and 1, before the extra one
  EXPECT_EQ(c.fallback_allocations, 3u);  // 9, 2 and 3
  EXPECT_EQ(arena.stats().live_bytes, 0u);
}

TEST(PlannedArena, DifferentFreeOrderFallsBackAndIsCounted) {
  HostResource host;
  PlannedArena arena(host);
  // Recorded: 0 is freed before 2 is allocated, so 2 may take 0's place.
  const std::vector<Op> recorded = {
      A(0, 64 * kKiB), A(1, 64 * kKiB), F(0), A(2, 64 * kKiB), F(1), F(2)};
  run_step(arena, recorded);
  ASSERT_TRUE(arena.has_plan());
  // Here 1 is freed instead and 0 is still live when 2 comes: 2 must not share 0's memory.
  // run_step checks that no live buffers overlap.
  const std::vector<Op> reordered = {
      A(0, 64 * kKiB), A(1, 64 * kKiB), F(1), A(2, 64 * kKiB), F(0), F(2)};
  run_step(arena, reordered);
  EXPECT_EQ(arena.counters().divergent_steps, 1u);
  EXPECT_EQ(arena.counters().planned_allocations, 2u);
}

TEST(PlannedArena, BufferKeptAcrossStepsMakesTheNextStepDivergent) {
  HostResource host;
  PlannedArena arena(host);
  run_step(arena, {A(0, 4 * kKiB), F(0)});
  arena.begin_step();
  void* kept = arena.allocate(4 * kKiB);
  arena.end_step();
  arena.begin_step();
  void* next = arena.allocate(4 * kKiB);
  EXPECT_NE(next, kept);
  arena.deallocate(next, 4 * kKiB);
  arena.end_step();
  arena.deallocate(kept, 4 * kKiB);  // outside a step: only bookkeeping
  // The step that kept the buffer stopped before its recorded free (divergent), and the
  // next one began with arena memory live (divergent from its start).
  EXPECT_EQ(arena.counters().divergent_steps, 2u);
  EXPECT_EQ(arena.counters().planned_allocations, 1u);
  EXPECT_EQ(arena.stats().live_bytes, 0u);
}

TEST(PlannedArena, ReplansAfterTheConfiguredDivergentStepsAndServesTheNewSequence) {
  HostResource host;
  StatsResource upstream(host);
  // One plan at most: a step of another kind diverges instead of being recorded beside it.
  PlannedArena arena(upstream,
                     PlannedArenaOptions{.replan_after_divergent_steps = 2, .max_plans = 1});
  const std::vector<Op> first = {A(0, 16 * kKiB), F(0)};
  const std::vector<Op> second = {A(0, 128 * kKiB), A(1, 128 * kKiB), F(0), F(1)};
  run_step(arena, first);
  const std::size_t first_size = arena.planned_arena_size();
  run_step(arena, second);
  EXPECT_TRUE(arena.has_plan());
  run_step(arena, second);
  EXPECT_FALSE(arena.has_plan());
  EXPECT_EQ(arena.counters().replans, 1u);
  EXPECT_EQ(arena.counters().divergent_steps, 2u);
  run_step(arena, second);  // recorded
  ASSERT_TRUE(arena.has_plan());
  EXPECT_GT(arena.planned_arena_size(), first_size);
  const auto before = arena.counters().planned_allocations;
  const std::vector<void*> a = run_step(arena, second);
  const std::vector<void*> b = run_step(arena, second);
  EXPECT_EQ(a, b);
  EXPECT_EQ(arena.counters().planned_allocations, before + 4);
  EXPECT_EQ(arena.counters().divergent_steps, 2u);
  EXPECT_EQ(arena.stats().segments, arena.fallback_pool().stats().segments + 1);  // old released
}

TEST(PlannedArena, StepsOfTwoShapesAreBothPlannedAndShareOneArena) {
  HostResource host;
  StatsResource upstream(host);
  PlannedArena arena(upstream);
  // Two image sizes: each step's first allocation tells them apart.
  const std::vector<Op> small = {
      A(0, 16 * kKiB), A(1, 32 * kKiB), F(0), A(2, 8 * kKiB), F(1), F(2)};
  const std::vector<Op> large = {A(0, 64 * kKiB), A(1, 128 * kKiB), F(0), F(1)};
  for (int round = 0; round < 4; ++round) {
    run_step(arena, small);
    run_step(arena, large);
  }
  const PlannedArenaCounters c = arena.counters();
  EXPECT_EQ(arena.plan_count(), 2u);
  EXPECT_EQ(c.recorded_steps, 2u);
  EXPECT_EQ(c.planned_steps, 6u);
  EXPECT_EQ(c.divergent_steps, 0u);
  EXPECT_EQ(c.planned_allocations, 3u * 3 + 3u * 2);
  // One arena, as large as the larger plan (192 KiB), not one per plan.
  EXPECT_EQ(arena.planned_arena_size(), 192 * kKiB);
  const std::size_t arena_reserved =
      arena.stats().reserved_bytes - arena.fallback_pool().stats().reserved_bytes;
  EXPECT_GE(arena_reserved, 192 * kKiB);
  EXPECT_LE(arena_reserved, 192 * kKiB + CachingPool::kRounding);  // slack to align the base
  EXPECT_EQ(run_step(arena, small), run_step(arena, small));
}

// Two image sizes whose steps begin alike (the time embedding comes first and does not depend
// on the image size), run one after the other as a user generates one image, then another:
// the second kind diverges from the first kind's plan until replan_after steps in a row
// replace that plan, and the same happens on the way back.
TEST(PlannedArena, KindsThatBeginAlikeTakeOverThePlanAfterReplanAfterSteps) {
  HostResource host;
  PlannedArena arena(host, PlannedArenaOptions{.replan_after_divergent_steps = 2});
  const std::vector<Op> small = {A(0, 4 * kKiB), A(1, 64 * kKiB), F(1), F(0)};
  const std::vector<Op> large = {A(0, 4 * kKiB), A(1, 256 * kKiB), F(1), F(0)};
  for (int i = 0; i < 5; ++i) run_step(arena, small);  // 1 recorded, 4 planned
  for (int i = 0; i < 5; ++i) run_step(arena, large);  // 2 divergent, 1 recorded, 2 planned
  PlannedArenaCounters c = arena.counters();
  EXPECT_EQ(c.divergent_steps, 2u);
  EXPECT_EQ(c.replans, 1u);
  EXPECT_EQ(c.recorded_steps, 2u);
  EXPECT_EQ(c.planned_allocations, 4u * 2 + 2 * 1 + 2u * 2);
  EXPECT_EQ(arena.plan_count(), 1u);
  for (int i = 0; i < 5; ++i) run_step(arena, small);  // and back
  c = arena.counters();
  EXPECT_EQ(c.divergent_steps, 4u);
  EXPECT_EQ(c.recorded_steps, 3u);
  EXPECT_EQ(arena.counters().replans, 2u);
  EXPECT_EQ(arena.stats().live_bytes, 0u);
}

TEST(PlannedArena, AKindOfStepBeyondMaxPlansFallsBackUntilItReplacesTheLeastRecentPlan) {
  HostResource host;
  PlannedArena arena(host, PlannedArenaOptions{.replan_after_divergent_steps = 2, .max_plans = 2});
  const std::vector<Op> a = {A(0, 4 * kKiB), F(0)};
  const std::vector<Op> b = {A(0, 8 * kKiB), F(0)};
  const std::vector<Op> c = {A(0, 12 * kKiB), F(0)};
  run_step(arena, a);
  run_step(arena, b);
  run_step(arena, b);  // b is now the most recently followed, a the least
  run_step(arena, c);  // no room, no match: divergent, from the fallback pool
  EXPECT_EQ(arena.counters().divergent_steps, 1u);
  EXPECT_EQ(arena.plan_count(), 2u);
  run_step(arena, c);  // two in a row: a is dropped
  EXPECT_EQ(arena.counters().replans, 1u);
  EXPECT_EQ(arena.plan_count(), 1u);
  run_step(arena, c);  // recorded
  run_step(arena, c);  // planned
  run_step(arena, b);  // still planned
  EXPECT_EQ(arena.plan_count(), 2u);
  EXPECT_EQ(arena.counters().recorded_steps, 3u);
  EXPECT_EQ(arena.counters().divergent_steps, 2u);
  EXPECT_EQ(arena.counters().planned_allocations, 3u);
}

TEST(PlannedArena, DroppedArenaIsReleasedWhenItsLastBufferIsFreed) {
  HostResource host;
  PlannedArena arena(host, PlannedArenaOptions{.replan_after_divergent_steps = 1});
  run_step(arena, {A(0, 4 * kKiB), F(0)});
  arena.begin_step();
  void* p = arena.allocate(4 * kKiB);  // from the arena
  void* q = arena.allocate(4 * kKiB);  // extra: divergent
  arena.end_step();
  EXPECT_FALSE(arena.has_plan());
  const std::size_t pool_segments = arena.fallback_pool().stats().segments;
  EXPECT_EQ(arena.stats().segments, pool_segments + 1);  // kept: p is live in it
  arena.deallocate(p, 4 * kKiB);
  EXPECT_EQ(arena.stats().segments, pool_segments);
  EXPECT_THROW(arena.deallocate(p, 4 * kKiB), InvalidPointer);
  arena.deallocate(q, 4 * kKiB);
}

// The bundled Stable Diffusion UNet trace (two passes), replayed as one step three times.
TEST(PlannedArena, SdTraceIsServedFromAnArenaWithinOnePercentOfPeakLive) {
  const EventTrace trace =
      read_event_trace(std::string(SDALLOC_DATA_DIR) + "/traces/sd15_unet_b2_64x64_cpu_2pass.csv");
  HostResource host;
  StatsResource upstream(host);
  PlannedArena arena(upstream);
  std::uint64_t recorded_fallbacks = 0;
  for (int step = 0; step < 3; ++step) {
    std::unordered_map<std::uint64_t, void*> live;
    arena.begin_step();
    for (const TraceEvent& e : trace.events) {
      if (e.op == TraceEvent::Op::kAlloc) {
        live[e.id] = arena.allocate(static_cast<std::size_t>(e.size));
      } else {
        arena.deallocate(live.at(e.id), static_cast<std::size_t>(e.size));
        live.erase(e.id);
      }
    }
    arena.end_step();
    for (const auto& [id, p] : live) {
      (void)id;
      (void)p;
      ADD_FAILURE() << "the trace leaves buffers live; the test assumes it does not";
    }
    if (step == 0) recorded_fallbacks = arena.counters().fallback_allocations;
  }
  ASSERT_TRUE(arena.has_plan());
  const auto peak = static_cast<double>(trace.peak_live_bytes());
  RecordProperty("arena_over_peak_live",
                 std::to_string(static_cast<double>(arena.planned_arena_size()) / peak));
  EXPECT_LE(static_cast<double>(arena.planned_arena_size()) / peak, 1.01);
  EXPECT_LE(static_cast<double>(arena.stats().reserved_bytes -
                                arena.fallback_pool().stats().reserved_bytes) /
                peak,
            1.01);
  // Over all three steps, the recording included, the upstream never held more.
  EXPECT_LE(static_cast<double>(upstream.stats().peak_bytes) / peak, 1.01);
  const PlannedArenaCounters c = arena.counters();
  EXPECT_EQ(c.fallback_allocations, recorded_fallbacks);
  EXPECT_EQ(c.fallback_allocations, 0u);
  EXPECT_EQ(c.recorded_allocations, trace.allocation_count());
  EXPECT_EQ(c.planned_allocations, 2 * trace.allocation_count());
  EXPECT_EQ(c.divergent_steps, 0u);
}

// Steps that differ from the recording in random ways (frees and allocations reordered,
// sizes changed) never get memory that overlaps a live buffer; run_step checks it.
TEST(PlannedArena, RandomlyPerturbedStepsNeverOverlapLiveBuffers) {
  std::mt19937 rng(12345);
  const std::vector<std::size_t> sizes = {512, 4 * kKiB, 20 * kKiB, 64 * kKiB, 100 * kKiB};
  std::vector<Op> base;
  std::vector<int> live;
  for (int id = 0; id < 60;) {
    if (!live.empty() && rng() % 2 == 0) {
      const std::size_t i = rng() % live.size();
      base.push_back(F(live[i]));
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      base.push_back(A(id, sizes[rng() % sizes.size()]));
      live.push_back(id++);
    }
  }
  for (int id : live) base.push_back(F(id));

  HostResource host;
  PlannedArena arena(host, PlannedArenaOptions{.replan_after_divergent_steps = 1000});
  run_step(arena, base);
  ASSERT_TRUE(arena.has_plan());
  std::uint64_t planned_before = arena.counters().planned_allocations;
  for (int variant = 0; variant < 200; ++variant) {
    std::vector<Op> ops = base;
    for (int m = 0, mutations = static_cast<int>(rng() % 4); m < mutations; ++m) {
      const std::size_t i = rng() % (ops.size() - 1);
      if (rng() % 2 == 0) {
        const bool frees_own_allocation =
            ops[i].is_alloc && !ops[i + 1].is_alloc && ops[i].id == ops[i + 1].id;
        if (!frees_own_allocation) std::swap(ops[i], ops[i + 1]);
      } else if (ops[i].is_alloc) {
        ops[i].size = sizes[rng() % sizes.size()];
      }
    }
    run_step(arena, ops);
    if (ops == base) {
      EXPECT_EQ(arena.counters().planned_allocations, planned_before + 60);
    }
    planned_before = arena.counters().planned_allocations;
  }
  EXPECT_GT(arena.counters().divergent_steps, 0u);
  EXPECT_LT(arena.counters().divergent_steps, 200u);
  EXPECT_EQ(arena.stats().live_bytes, 0u);
}

TEST(PlannedArena, FreeOfArenaMemoryOnAnotherStreamMakesTheStepDivergent) {
  HostResource host;
  PlannedArena arena(host);
  run_step(arena, {A(0, 4 * kKiB), F(0), A(1, 4 * kKiB), F(1)});
  arena.begin_step();
  void* p = arena.allocate(4 * kKiB);
  arena.deallocate(p, 4 * kKiB, Stream(7));
  void* q = arena.allocate(4 * kKiB);
  arena.deallocate(q, 4 * kKiB);
  arena.end_step();
  EXPECT_EQ(arena.counters().planned_allocations, 1u);
  EXPECT_EQ(arena.counters().divergent_steps, 1u);
  EXPECT_EQ(arena.stats().live_bytes, 0u);
}

TEST(PlannedArena, DoubleFreeForeignAndInteriorPointersAreRejected) {
  HostResource host;
  PlannedArena arena(host);
  run_step(arena, kLoop);
  arena.begin_step();
  void* p = arena.allocate(64 * kKiB);
  int on_stack = 0;
  EXPECT_THROW(arena.deallocate(&on_stack, sizeof on_stack), InvalidPointer);
  EXPECT_THROW(arena.deallocate(static_cast<char*>(p) + 512, 512), InvalidPointer);
  EXPECT_THROW(arena.deallocate(p, 1000), InvalidArgument);
  void* q = arena.allocate(32 * kKiB);
  arena.deallocate(p, 64 * kKiB);
  EXPECT_THROW(arena.deallocate(p, 64 * kKiB), InvalidPointer);
  arena.deallocate(q, 32 * kKiB);
  arena.end_step();
  EXPECT_EQ(arena.stats().live_bytes, 0u);
  // Rejected calls changed nothing: the loop is still served by the plan.
  const auto before = arena.counters().planned_allocations;
  run_step(arena, kLoop);
  EXPECT_EQ(arena.counters().planned_allocations, before + 4);
}

TEST(PlannedArena, ZeroBytesBadAlignmentAndStepMisuseAreHandled) {
  HostResource host;
  PlannedArena arena(host);
  EXPECT_EQ(arena.allocate(0), nullptr);
  arena.deallocate(nullptr, 0);
  EXPECT_THROW(arena.allocate(64, 3, kDefaultStream), InvalidArgument);
  EXPECT_THROW(arena.allocate(CachingPool::kMaxAllocation + 1), OutOfMemory);
  EXPECT_THROW(arena.end_step(), InvalidArgument);
  arena.begin_step();
  EXPECT_THROW(arena.begin_step(), InvalidArgument);
  void* p = arena.allocate(4096, 4096, kDefaultStream);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 4096, 0u);
  arena.deallocate(p, 4096);
  arena.end_step();
  arena.begin_step();
  void* planned = arena.allocate(4096, 4096, kDefaultStream);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(planned) % 4096, 0u);
  arena.deallocate(planned, 4096);
  arena.end_step();
  EXPECT_EQ(arena.counters().planned_allocations, 1u);
  EXPECT_EQ(arena.counters().divergent_steps, 0u);
  EXPECT_THROW(PlannedArena(host, PlannedArenaOptions{.replan_after_divergent_steps = 0}),
               InvalidArgument);
}

TEST(PlannedArena, OtherStreamsUseTheFallbackPoolConcurrently) {
  HostResource host;
  PlannedArena arena(host);
  run_step(arena, kLoop);
  const std::vector<void*> planned = run_step(arena, kLoop);
  std::atomic<bool> stop{false};
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (std::uintptr_t s = 1; s <= 2; ++s) {
    threads.emplace_back([&, s] {
      const Stream stream(s);
      const auto fill = static_cast<unsigned char>(s);
      while (!stop.load()) {
        auto* p = static_cast<unsigned char*>(arena.allocate(64 * kKiB, stream));
        for (const void* q : planned) {
          if (inside(p, planned[0], arena.planned_arena_size()) || p == q) ++errors;
        }
        std::memset(p, fill, 64 * kKiB);
        if (std::count(p, p + 64 * kKiB, fill) != static_cast<long>(64 * kKiB)) ++errors;
        arena.deallocate(p, 64 * kKiB, stream);
      }
    });
  }
  for (int i = 0; i < 200; ++i) EXPECT_EQ(run_step(arena, kLoop), planned);
  stop = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(arena.counters().divergent_steps, 0u);
  EXPECT_EQ(arena.stats().live_bytes, 0u);
}

}  // namespace
}  // namespace sdalloc
