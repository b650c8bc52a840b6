// failed_release_test.cpp - a resource that refuses to take memory back cannot fail a free.
//
// Findings FA1-FA3 and FV1 of issue 15: when the resource's deallocate (or the virtual
// memory's unmap) failed while a pool gave memory back, CachingPool::free threw for a free
// that had happened and leaked its segment records, PlannedArena's recording books broke,
// and VirtualMemoryPool's eager unmap made free() throw. The rule now: memory leaves the
// pool's books before it goes back; what the resource refuses is left to it and counted in
// PoolStats::failed_releases; the request that released it succeeds; the pool stays usable.
#include <gtest/gtest.h>

#include <cstddef>

#include "sdalloc/policies/caching_pool.hpp"
#include "sdalloc/policies/planned_arena.hpp"
#include "sdalloc/policies/virtual_memory_pool.hpp"
#include "sdalloc/resources/host_resource.hpp"
#include "sdalloc/resources/host_virtual_memory.hpp"
#include "support/fault_injection.hpp"

namespace sdalloc::test {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

TEST(FailedRelease, CachingPoolTrimAndFreeSurviveARefusedDeallocate) {
  HostResource host;
  FaultPlan plan;
  plan.count_only({ResourceCall::kDeallocate});
  FaultInjectingResource faulty(host, plan);
  CachingPool pool(faulty);
  void* a = pool.allocate(8 * kMiB);
  void* b = pool.allocate(64 * kMiB);
  pool.free(a);
  pool.free(b);
  plan.fail_call(0);  // the first segment going back is refused
  EXPECT_NO_THROW(pool.trim());
  EXPECT_EQ(plan.failures(), 1u);
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.failed_releases, 1u);
  EXPECT_EQ(s.reserved_bytes, 0u) << "a refused segment leaves the books all the same";
  pool.check_invariants();
  void* c = pool.allocate(16 * kMiB);  // usable after
  ASSERT_NE(c, nullptr);
  pool.free(c);
  pool.check_invariants();
}

TEST(FailedRelease, PlannedArenaRecordingSurvivesARefusedDeallocate) {
  HostResource host;
  FaultPlan plan;
  plan.count_only({ResourceCall::kDeallocate});
  FaultInjectingResource faulty(host, plan);
  PlannedArena arena(faulty, {.planner_time_limit_seconds = 0.05});
  arena.begin_step();
  void* a = arena.allocate(4 * kMiB);
  arena.free(a);
  plan.fail_call(0);  // the recording's cache gives a block back for a larger one
  void* b = nullptr;
  EXPECT_NO_THROW(b = arena.allocate(32 * kMiB));
  ASSERT_NE(b, nullptr);
  arena.check_invariants();
  arena.free(b);
  EXPECT_NO_THROW(arena.end_step());
  arena.check_invariants();
  EXPECT_GE(plan.failures(), 1u);
  EXPECT_EQ(arena.stats().failed_releases, plan.failures());
}

TEST(FailedRelease, VirtualMemoryPoolEagerUnmapFreeSucceedsWhenUnmapIsRefused) {
  HostVirtualMemory memory;
  FaultPlan plan;
  plan.count_only({ResourceCall::kUnmap});
  FaultInjectingVirtualMemory faulty(memory, plan);
  VirtualMemoryPool pool(faulty, {.range_size = std::size_t{1} << 30, .eager_unmap = true});
  void* a = pool.allocate(8 * kMiB);
  plan.fail_call(0);
  EXPECT_NO_THROW(pool.free(a));
  EXPECT_EQ(plan.failures(), 1u);
  EXPECT_EQ(pool.stats().failed_releases, 1u);
  EXPECT_EQ(pool.stats().live_bytes, 0u);
  pool.check_invariants();
  void* b = pool.allocate(8 * kMiB);  // the page left mapped serves again
  ASSERT_NE(b, nullptr);
  pool.free(b);
  pool.check_invariants();
}

}  // namespace
}  // namespace sdalloc::test
