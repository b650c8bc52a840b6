// arena_test.cpp - Arena and SharedArena: occupancy by slot, and reserving, growing,
// retiring and trimming the arena the plans share.
#include "policies/planned_arena/arena.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>

#include "sdalloc/policies/any_pool.hpp"
#include "sdalloc/resources/host_resource.hpp"
#include "sdalloc/resources/limit_resource.hpp"
#include "sdalloc/resources/stats_resource.hpp"

namespace sdalloc::planned_arena_detail {
namespace {

constexpr std::size_t kKiB = 1024;

// What an arena of `bytes` reserves: planned alignments are at least kRounding, stricter
// than the upstream's kMinAlignment, so the base takes slack to align up.
constexpr std::size_t segment(std::size_t bytes) { return bytes + kRounding - kMinAlignment; }

// A plan of two buffers of `bytes` each, live at once: offsets 0 and `bytes`.
std::shared_ptr<StepPlan> two_buffers(std::size_t bytes) {
  auto plan = std::make_shared<StepPlan>();
  for (std::size_t k = 0; k < 2; ++k) {
    Slot slot;
    slot.rounded = bytes;
    slot.alignment = kRounding;
    slot.allocated_at = static_cast<std::int64_t>(k);
    slot.freed_at = static_cast<std::int64_t>(2 + k);
    slot.offset = k * bytes;
    slot.offset_index = k;
    plan->slots.push_back(slot);
  }
  plan->events = {Event{true, 0}, Event{true, 1}, Event{false, 0}, Event{false, 1}};
  plan->offsets = {0, bytes};
  plan->size = 2 * bytes;
  return plan;
}

class PlannedArenaSharedArena : public ::testing::Test {
 protected:
  HostResource host;
  StatsResource upstream{host};
  PoolOf<CachingPool> pool{upstream};
};

TEST_F(PlannedArenaSharedArena, GrowReservesAnArenaThatHoldsThePlan) {
  SharedArena arenas(upstream, pool, HostStreamEvents::instance(), false);
  const auto plan = two_buffers(4 * kKiB);
  EXPECT_FALSE(arenas.holds(*plan));
  EXPECT_EQ(arenas.current(), nullptr);
  ASSERT_TRUE(arenas.grow_for(*plan, kDefaultStream, true));
  EXPECT_TRUE(arenas.holds(*plan));
  EXPECT_EQ(arenas.size(), 8 * kKiB);
  EXPECT_EQ(upstream.stats().current_bytes, segment(8 * kKiB));
  const ArenaFigures f = arenas.figures();
  EXPECT_EQ(f.reserved_bytes, segment(8 * kKiB));
  EXPECT_EQ(f.arenas, 1u);
  EXPECT_EQ(f.reservations, 1u);
}

TEST_F(PlannedArenaSharedArena, SlotIsServedAtItsOffsetAndOnlyOnceWhileLive) {
  SharedArena arenas(upstream, pool, HostStreamEvents::instance(), false);
  const auto plan = two_buffers(4 * kKiB);
  ASSERT_TRUE(arenas.grow_for(*plan, kDefaultStream, true));
  arenas.current()->occupy(plan);
  void* first = arenas.place(0, 4000);
  void* second = arenas.place(1, 4096);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(second) - reinterpret_cast<std::uintptr_t>(first),
            4 * kKiB);
  EXPECT_EQ(arenas.place(0, 4000), nullptr);  // its offset is taken

  bool is_current = false;
  const auto addr = reinterpret_cast<std::uintptr_t>(first);
  Arena* arena = arenas.find(addr, &is_current);
  ASSERT_EQ(arena, arenas.current());
  EXPECT_TRUE(is_current);
  std::size_t index = 0;
  EXPECT_EQ(arena->live_slot_at(addr, &index), 0);
  EXPECT_EQ(arena->requested(0), 4000u);
  EXPECT_EQ(arena->live_slot_at(addr + kRounding, &index), -1);  // inside a buffer
  EXPECT_EQ(arenas.figures().live_bytes, 4000u + 4096u);

  arenas.vacate(*arena, index, 0);
  EXPECT_EQ(arena->live_slot_at(addr, &index), -1);
  EXPECT_NE(arenas.place(0, 4000), nullptr);
  EXPECT_EQ(arenas.figures().allocations, 3u);
  EXPECT_EQ(arenas.figures().frees, 1u);
}

TEST_F(PlannedArenaSharedArena, TrimReleasesAnEmptyArenaAndReserveAgainTakesItBack) {
  SharedArena arenas(upstream, pool, HostStreamEvents::instance(), false);
  const auto plan = two_buffers(4 * kKiB);
  ASSERT_TRUE(arenas.grow_for(*plan, kDefaultStream, true));
  EXPECT_EQ(arenas.trim(), segment(8 * kKiB));
  EXPECT_EQ(upstream.stats().current_bytes, 0u);
  EXPECT_EQ(arenas.size(), 8 * kKiB);  // the plans keep their arena's size
  EXPECT_EQ(arenas.trim(), 0u);
  EXPECT_TRUE(arenas.reserve_again());
  EXPECT_TRUE(arenas.current()->reserved());
  EXPECT_EQ(upstream.stats().current_bytes, segment(8 * kKiB));
}

TEST_F(PlannedArenaSharedArena, TrimKeepsAnArenaWithLiveMemory) {
  SharedArena arenas(upstream, pool, HostStreamEvents::instance(), false);
  const auto plan = two_buffers(4 * kKiB);
  ASSERT_TRUE(arenas.grow_for(*plan, kDefaultStream, true));
  arenas.current()->occupy(plan);
  ASSERT_NE(arenas.place(0, 4 * kKiB), nullptr);
  EXPECT_EQ(arenas.trim(), 0u);
  EXPECT_TRUE(arenas.current()->reserved());
}

TEST_F(PlannedArenaSharedArena, GrowingPastALiveBufferRetiresTheOldArenaUntilItEmpties) {
  SharedArena arenas(upstream, pool, HostStreamEvents::instance(), false);
  const auto small = two_buffers(4 * kKiB);
  ASSERT_TRUE(arenas.grow_for(*small, kDefaultStream, true));
  arenas.current()->occupy(small);
  void* kept = arenas.place(0, 4 * kKiB);
  ASSERT_NE(kept, nullptr);

  ASSERT_TRUE(arenas.grow_for(*two_buffers(8 * kKiB), kDefaultStream, false));
  EXPECT_EQ(arenas.size(), 16 * kKiB);
  EXPECT_EQ(arenas.figures().arenas, 2u);
  EXPECT_EQ(upstream.stats().current_bytes, segment(8 * kKiB) + segment(16 * kKiB));

  bool is_current = true;
  const auto addr = reinterpret_cast<std::uintptr_t>(kept);
  Arena* old = arenas.find(addr, &is_current);
  ASSERT_NE(old, nullptr);
  EXPECT_FALSE(is_current);
  std::size_t index = 0;
  ASSERT_EQ(old->live_slot_at(addr, &index), 0);
  arenas.vacate(*old, index, 0);  // its last buffer: the old arena goes back
  EXPECT_EQ(arenas.figures().arenas, 1u);
  EXPECT_EQ(upstream.stats().current_bytes, segment(16 * kKiB));
  EXPECT_EQ(arenas.find(addr, &is_current), nullptr);
}

TEST_F(PlannedArenaSharedArena, EmptyArenaGoesBackBeforeItsReplacementIsReserved) {
  SharedArena arenas(upstream, pool, HostStreamEvents::instance(), false);
  ASSERT_TRUE(arenas.grow_for(*two_buffers(4 * kKiB), kDefaultStream, true));
  ASSERT_TRUE(arenas.grow_for(*two_buffers(8 * kKiB), kDefaultStream, false));
  EXPECT_EQ(upstream.stats().peak_bytes, segment(16 * kKiB));  // never both at once
  EXPECT_EQ(arenas.figures().releases, 1u);
}

TEST_F(PlannedArenaSharedArena, RefusedGrowthIsCountedAndKeepsTheOldArena) {
  LimitResource card(upstream, 12 * kKiB);
  PoolOf<CachingPool> card_pool(card);
  SharedArena arenas(card, card_pool, HostStreamEvents::instance(), false);
  ASSERT_TRUE(arenas.grow_for(*two_buffers(4 * kKiB), kDefaultStream, true));
  EXPECT_FALSE(arenas.grow_for(*two_buffers(8 * kKiB), kDefaultStream, false));
  EXPECT_EQ(arenas.figures().failures, 1u);
  ASSERT_NE(arenas.current(), nullptr);
  EXPECT_EQ(arenas.size(), 8 * kKiB);
  EXPECT_FALSE(arenas.current()->reserved());  // released to make room; taken back next step
  EXPECT_TRUE(arenas.reserve_again());
  EXPECT_EQ(card.used(), segment(8 * kKiB));
}

TEST_F(PlannedArenaSharedArena, RefusedGrowthWithNoPlansLeftRetiresTheArena) {
  LimitResource card(upstream, 12 * kKiB);
  PoolOf<CachingPool> card_pool(card);
  SharedArena arenas(card, card_pool, HostStreamEvents::instance(), false);
  ASSERT_TRUE(arenas.grow_for(*two_buffers(4 * kKiB), kDefaultStream, true));
  EXPECT_FALSE(arenas.grow_for(*two_buffers(8 * kKiB), kDefaultStream, true));
  EXPECT_EQ(arenas.current(), nullptr);
  EXPECT_EQ(card.used(), 0u);
}

TEST_F(PlannedArenaSharedArena, RefusedReserveAgainIsCounted) {
  LimitResource card(upstream, 9 * kKiB);
  PoolOf<CachingPool> card_pool(card);
  SharedArena arenas(card, card_pool, HostStreamEvents::instance(), false);
  ASSERT_TRUE(arenas.grow_for(*two_buffers(4 * kKiB), kDefaultStream, true));
  ASSERT_EQ(arenas.trim(), segment(8 * kKiB));
  void* other = card.allocate(kKiB);  // someone else took memory while it was trimmed
  EXPECT_FALSE(arenas.reserve_again());
  EXPECT_EQ(arenas.figures().failures, 1u);
  card.deallocate(other, kKiB);
}

TEST_F(PlannedArenaSharedArena, DestructorReleasesCurrentAndRetiredArenas) {
  {
    SharedArena arenas(upstream, pool, HostStreamEvents::instance(), false);
    const auto small = two_buffers(4 * kKiB);
    ASSERT_TRUE(arenas.grow_for(*small, kDefaultStream, true));
    arenas.current()->occupy(small);
    ASSERT_NE(arenas.place(0, 4 * kKiB), nullptr);
    ASSERT_TRUE(arenas.grow_for(*two_buffers(8 * kKiB), kDefaultStream, false));
  }
  EXPECT_EQ(upstream.stats().current_bytes, 0u);
}

}  // namespace
}  // namespace sdalloc::planned_arena_detail
