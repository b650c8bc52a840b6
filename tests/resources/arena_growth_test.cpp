// Arena growth: a resource makes a range it handed out longer in place (HostResource over
// the address space it reserved behind the range, the adaptors forwarding), and CachingPool
// grows its consolidated arena so when a request outgrows it, instead of taking a segment
// beside it.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/policies/caching_pool.hpp"
#include "sdalloc/resources/host_resource.hpp"
#include "sdalloc/resources/limit_resource.hpp"
#include "sdalloc/resources/segments_only_resource.hpp"
#include "sdalloc/resources/stats_resource.hpp"
#include "support/arena_after_churn.hpp"
#include "support/mapped_pages.hpp"

namespace sdalloc {
namespace {

using test::bytes_of;
using test::is_unmapped;
using test::pages_holding;

constexpr std::size_t kPage = HostResource::kPageSize;
constexpr std::size_t kMiB = std::size_t{1} << 20;

// ---------------------------------------------------------------------------------------
// the resource

TEST(GrowTest, HostGrowsInPlaceKeepingWhatTheRangeHolds) {
  HostResource host;
  ASSERT_TRUE(host.can_grow());
  void* a = host.allocate(4 * kMiB);
  std::memset(a, 0x51, 4 * kMiB);
  ASSERT_TRUE(host.grow(a, 4 * kMiB, 6 * kMiB, {}));
  EXPECT_EQ(pages_holding(a, 4 * kMiB, 0x51), 4 * kMiB / kPage);
  EXPECT_EQ(pages_holding(bytes_of(a) + 4 * kMiB, 2 * kMiB, 0), 2 * kMiB / kPage)
      << "the new part is fresh memory";
  std::memset(bytes_of(a) + 4 * kMiB, 0x52, 2 * kMiB);  // and writable
  ASSERT_TRUE(host.grow(a, 6 * kMiB, 8 * kMiB, {})) << "room for the range's size again";
  host.deallocate(a, 8 * kMiB);
  EXPECT_TRUE(is_unmapped(a, 16 * kMiB)) << "the range and what is left of its room";
}

TEST(GrowTest, TheDonorsPagesBecomeTheNewPart) {
  HostResource host;
  void* a = host.allocate(4 * kMiB);
  void* donor = host.allocate(3 * kMiB);
  std::memset(donor, 0x61, 3 * kMiB);
  const ResourceRange donors[] = {{donor, 3 * kMiB}};
  ASSERT_TRUE(host.grow(a, 4 * kMiB, 6 * kMiB, donors));
  EXPECT_EQ(pages_holding(bytes_of(a) + 4 * kMiB, 2 * kMiB, 0x61), 2 * kMiB / kPage)
      << "moved, not faulted in fresh";
  EXPECT_TRUE(is_unmapped(donor, 6 * kMiB)) << "the donor, its cut tail and its room are gone";
  host.deallocate(a, 6 * kMiB);
}

TEST(GrowTest, WithoutRoomItRefusesAndNothingChanges) {
  HostResource host;
  void* a = host.allocate(4 * kMiB);
  void* donor = host.allocate(kMiB);
  std::memset(donor, 0x71, kMiB);
  const ResourceRange donors[] = {{donor, kMiB}};
  EXPECT_FALSE(host.grow(a, 4 * kMiB, 9 * kMiB, donors)) << "beyond the room (4 MiB)";
  EXPECT_FALSE(host.grow(a, 4 * kMiB, 4 * kMiB, donors)) << "not longer";
  EXPECT_FALSE(host.grow(nullptr, 0, kMiB, donors));
  EXPECT_EQ(pages_holding(donor, kMiB, 0x71), kMiB / kPage) << "the donor is still the caller's";
  ASSERT_TRUE(host.grow(a, 4 * kMiB, 8 * kMiB, {})) << "the room is intact";
  host.deallocate(donor, kMiB);
  host.deallocate(a, 8 * kMiB);

  HostResource roomless(HostResourceOptions{.growth_room = false});
  EXPECT_FALSE(roomless.can_grow());
  void* b = roomless.allocate(2 * kMiB);
  EXPECT_FALSE(roomless.grow(b, 2 * kMiB, 3 * kMiB, {}));
  roomless.deallocate(b, 2 * kMiB);
  EXPECT_TRUE(is_unmapped(b, 2 * kMiB));

  HostResource plain_host;
  SegmentsOnlyResource plain(plain_host);  // as a GPU's: no split, grow or coalesce
  EXPECT_FALSE(plain.can_grow());
  void* c = plain.allocate(2 * kMiB);
  EXPECT_FALSE(plain.grow(c, 2 * kMiB, 3 * kMiB, {}));
  plain.deallocate(c, 2 * kMiB);
}

TEST(GrowTest, ASplitRangeKeepsTheRoomWithItsSecondPart) {
  HostResource host;
  void* a = host.allocate(4 * kMiB);
  ASSERT_TRUE(host.split(a, 4 * kMiB, kMiB));
  void* second = bytes_of(a) + kMiB;
  EXPECT_FALSE(host.grow(a, kMiB, 2 * kMiB, {})) << "its end is the second part's start";
  ASSERT_TRUE(host.grow(second, 3 * kMiB, 5 * kMiB, {}));
  host.deallocate(a, kMiB);
  host.deallocate(second, 5 * kMiB);
  EXPECT_TRUE(is_unmapped(a, 8 * kMiB));
}

TEST(GrowTest, AdaptorsForwardAndCountTheNetChange) {
  HostResource host;
  LimitResource cap(host, 8 * kMiB);
  StatsResource stats(cap);
  ASSERT_TRUE(stats.can_grow());
  void* a = stats.allocate(4 * kMiB);
  void* donor = stats.allocate(2 * kMiB);
  EXPECT_EQ(cap.used(), 6 * kMiB);
  const ResourceRange donors[] = {{donor, 2 * kMiB}};
  ASSERT_TRUE(stats.grow(a, 4 * kMiB, 7 * kMiB, donors));
  EXPECT_EQ(cap.used(), 7 * kMiB) << "7 MiB held: the donor's 2 MiB went into the range";
  EXPECT_EQ(stats.stats().current_bytes, 7 * kMiB);
  EXPECT_EQ(stats.stats().current_count, 1u);
  EXPECT_EQ(stats.stats().peak_bytes, 7 * kMiB);
  EXPECT_EQ(stats.stats().deallocations, 1u);
  EXPECT_FALSE(stats.grow(a, 7 * kMiB, 9 * kMiB, {})) << "beyond the cap: refused, unchanged";
  EXPECT_EQ(cap.used(), 7 * kMiB);
  EXPECT_EQ(stats.stats().current_bytes, 7 * kMiB);
  stats.deallocate(a, 7 * kMiB);
  EXPECT_EQ(cap.used(), 0u);
  EXPECT_EQ(stats.stats().current_bytes, 0u);
}

// ---------------------------------------------------------------------------------------
// the pool

CachingPoolOptions plain_options() { return test::arena_test_options(); }

// The pool after support/arena_after_churn.hpp's sequence: a 12 MiB arena (14 MiB where it
// cannot grow) with `low`, 1 MiB, live at its start.
struct WithArena {
  explicit WithArena(MemoryResource& upstream, CachingPoolOptions options = plain_options())
      : pool(upstream, options), low(test::churn_into_arena(pool)) {}
  CachingPool pool;
  void* low = nullptr;
};

TEST(ArenaGrowthTest, ALargerRequestGrowsTheArenaByWhatItLacks) {
  HostResource host;
  StatsResource counted(host);
  WithArena w(counted);
  ASSERT_EQ(w.pool.stats().consolidations, 1u);
  ASSERT_EQ(w.pool.stats().segments, 1u);
  ASSERT_EQ(w.pool.stats().reserved_bytes, 12 * kMiB);
  // 16 MiB with 11 MiB free at the arena's end: it grows by 5 MiB, in place.
  void* big = w.pool.allocate(16 * kMiB);
  const PoolStats s = w.pool.stats();
  EXPECT_EQ(s.arena_growths, 1u);
  EXPECT_EQ(s.segments, 1u) << "no segment beside the arena";
  EXPECT_EQ(s.reserved_bytes, 17 * kMiB);
  EXPECT_EQ(s.peak_reserved_bytes, 17 * kMiB);
  EXPECT_EQ(bytes_of(big), bytes_of(w.low) + kMiB) << "served from the grown tail";
  std::memset(big, 0x7f, 16 * kMiB);
  EXPECT_EQ(counted.stats().current_bytes, 17 * kMiB);
  EXPECT_EQ(counted.stats().current_count, 1u);
  w.pool.check_invariants();
  // Freed, the arena is one block of 17 MiB again: a 17 MiB request needs no growth.
  w.pool.free(big);
  w.pool.free(w.low);
  void* whole = w.pool.allocate(17 * kMiB);
  EXPECT_EQ(w.pool.stats().arena_growths, 1u);
  EXPECT_EQ(w.pool.stats().reserved_bytes, 17 * kMiB);
  w.pool.free(whole);
  w.pool.check_invariants();
}

TEST(ArenaGrowthTest, AnArenaFullToItsEndGetsANewFreeBlockBehindTheLastOne) {
  HostResource host;
  WithArena w(host);
  void* rest = w.pool.allocate(11 * kMiB);  // the arena is full
  void* more = w.pool.allocate(2 * kMiB);
  EXPECT_EQ(w.pool.stats().arena_growths, 1u);
  EXPECT_EQ(w.pool.stats().segments, 1u);
  EXPECT_EQ(bytes_of(more), bytes_of(rest) + 11 * kMiB);
  w.pool.check_invariants();
  w.pool.free(rest);
  w.pool.free(more);
  w.pool.free(w.low);
  EXPECT_EQ(w.pool.stats().largest_free_block, 14 * kMiB) << "the parts merge";
  w.pool.check_invariants();
}

TEST(ArenaGrowthTest, TurnedOffOrOverAResourceThatCannotASegmentGoesBeside) {
  HostResource host;
  CachingPoolOptions off = plain_options();
  off.grow_arena = false;
  WithArena without(host, off);
  void* big = without.pool.allocate(16 * kMiB);
  EXPECT_EQ(without.pool.stats().arena_growths, 0u);
  EXPECT_EQ(without.pool.stats().segments, 2u);
  EXPECT_EQ(without.pool.stats().reserved_bytes, 30 * kMiB) << "a 14 MiB arena: headroom";
  without.pool.free(big);
  without.pool.check_invariants();

  HostResource roomless(HostResourceOptions{.growth_room = false});
  WithArena over_roomless(roomless);
  big = over_roomless.pool.allocate(16 * kMiB);
  EXPECT_EQ(over_roomless.pool.stats().arena_growths, 0u);
  EXPECT_EQ(over_roomless.pool.stats().segments, 2u);
  over_roomless.pool.free(big);
  over_roomless.pool.check_invariants();
}

TEST(ArenaGrowthTest, BeyondACapTheRequestFailsCleanlyAndThePoolIsUnchanged) {
  HostResource host;
  LimitResource cap(host, 16 * kMiB);
  WithArena w(cap);
  ASSERT_EQ(w.pool.stats().reserved_bytes, 12 * kMiB);
  EXPECT_THROW(w.pool.allocate(16 * kMiB), OutOfMemory) << "17 MiB would be needed";
  const PoolStats s = w.pool.stats();
  EXPECT_EQ(s.arena_growths, 0u);
  EXPECT_EQ(s.live_bytes, kMiB);
  EXPECT_EQ(cap.used(), s.reserved_bytes);
  w.pool.check_invariants();
  // Within the cap it grows.
  void* fits = w.pool.allocate(15 * kMiB);
  EXPECT_EQ(w.pool.stats().arena_growths, 1u);
  EXPECT_EQ(cap.used(), 16 * kMiB);
  w.pool.free(fits);
  w.pool.check_invariants();
}

}  // namespace
}  // namespace sdalloc
