// recording_blocks_test.cpp - RecordingBlocks: a recording's blocks straight from the
// upstream, and the cache that keeps them within the most that was live.
#include "policies/planned_arena/recording_blocks.hpp"

#include <gtest/gtest.h>

#include <cstdint>

#include "policies/planned_arena/step_plan.hpp"  // kRounding
#include "sdalloc/core/errors.hpp"
#include "sdalloc/resources/host_resource.hpp"
#include "sdalloc/resources/limit_resource.hpp"
#include "sdalloc/resources/stats_resource.hpp"

namespace sdalloc::planned_arena_detail {
namespace {

constexpr std::size_t kKiB = 1024;

// What a block of `bytes` takes from the upstream at kRounding, the least alignment
// PlannedArena asks for: slack above the upstream's kMinAlignment to align up.
constexpr std::size_t raw(std::size_t bytes) { return bytes + kRounding - kMinAlignment; }

class PlannedArenaRecordingBlocks : public ::testing::Test {
 protected:
  HostResource host;
  StatsResource upstream{host};
};

TEST_F(PlannedArenaRecordingBlocks, FreedBlockIsReusedForTheSameSize) {
  RecordingBlocks blocks(upstream);
  void* a = blocks.allocate(1000, kKiB, kRounding, kDefaultStream);
  blocks.free(a, /*cache=*/true);
  void* b = blocks.allocate(900, kKiB, kRounding, kDefaultStream);
  EXPECT_EQ(b, a);
  EXPECT_EQ(upstream.stats().allocations, 1u);
  EXPECT_EQ(blocks.requested_size(b), 900u);
  const RecordingBlockFigures f = blocks.figures();
  EXPECT_EQ(f.allocations, 2u);
  EXPECT_EQ(f.upstream_allocations, 1u);
  blocks.free(b, false);
}

TEST_F(PlannedArenaRecordingBlocks, FreeWithoutCacheGoesBackAtOnce) {
  RecordingBlocks blocks(upstream);
  void* a = blocks.allocate(kKiB, kKiB, kRounding, kDefaultStream);
  blocks.free(a, /*cache=*/false);
  EXPECT_EQ(upstream.stats().current_bytes, 0u);
  EXPECT_EQ(blocks.requested_size(a), std::nullopt);
  EXPECT_EQ(blocks.figures().held_bytes, 0u);
}

TEST_F(PlannedArenaRecordingBlocks, HoldsNoMoreThanTheMostThatWasLive) {
  RecordingBlocks blocks(upstream);
  void* a = blocks.allocate(4 * kKiB, 4 * kKiB, kRounding, kDefaultStream);
  blocks.free(a, true);
  // A new size: the cached 4 KiB go back first, so no more than that was ever held.
  void* b = blocks.allocate(2 * kKiB, 2 * kKiB, kRounding, kDefaultStream);
  EXPECT_EQ(upstream.stats().peak_bytes, raw(4 * kKiB));
  EXPECT_EQ(upstream.stats().current_bytes, raw(2 * kKiB));
  blocks.free(b, true);
  // Within the peak, a cached block may stay beside a new one.
  void* c = blocks.allocate(kKiB, kKiB, kRounding, kDefaultStream);
  EXPECT_EQ(upstream.stats().current_bytes, raw(2 * kKiB) + raw(kKiB));
  blocks.free(c, false);
  blocks.release_cache();
  EXPECT_EQ(upstream.stats().current_bytes, 0u);
}

TEST_F(PlannedArenaRecordingBlocks, StricterAlignmentIsHonoured) {
  RecordingBlocks blocks(upstream);
  constexpr std::size_t kAlignment = 64 * kKiB;
  void* p = blocks.allocate(kKiB, kKiB, kAlignment, kDefaultStream);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % kAlignment, 0u);
  PoolLayout layout;
  blocks.add_layout(layout);
  ASSERT_EQ(layout.segments.size(), 1u);
  const SegmentLayout& segment = layout.segments[0];
  EXPECT_EQ(segment.size, kKiB + kAlignment - kMinAlignment);
  std::size_t live = 0;
  for (const BlockLayout& block : segment.blocks) {
    if (block.state == BlockState::kLive) {
      ++live;
      EXPECT_EQ(block.address, reinterpret_cast<std::uintptr_t>(p));
    }
  }
  EXPECT_EQ(live, 1u);
  blocks.free(p, false);
}

TEST_F(PlannedArenaRecordingBlocks, RefusalAfterTheCacheWentBackIsOutOfMemory) {
  LimitResource card(upstream, raw(4 * kKiB));
  RecordingBlocks blocks(card);
  void* a = blocks.allocate(3 * kKiB, 3 * kKiB, kRounding, kDefaultStream);
  blocks.free(a, true);
  void* b = blocks.allocate(4 * kKiB, 4 * kKiB, kRounding, kDefaultStream);  // cache goes back
  EXPECT_THROW(blocks.allocate(kKiB, kKiB, kRounding, kDefaultStream), OutOfMemory);
  EXPECT_EQ(blocks.figures().live_blocks, 1u);
  blocks.free(b, false);
}

TEST_F(PlannedArenaRecordingBlocks, DestructorGivesEveryBlockBack) {
  {
    RecordingBlocks blocks(upstream);
    blocks.allocate(kKiB, kKiB, kRounding, kDefaultStream);
    void* cached = blocks.allocate(2 * kKiB, 2 * kKiB, kRounding, kDefaultStream);
    blocks.free(cached, true);
    EXPECT_EQ(blocks.figures().blocks, 2u);
  }
  EXPECT_EQ(upstream.stats().current_bytes, 0u);
}

// The peak of live raw bytes bounds the cache (HoldsNoMoreThanTheMostThatWasLive), so it
// outlasts the blocks; PlannedArena::reset_peak() does not touch it.
TEST_F(PlannedArenaRecordingBlocks, ThePeakThatBoundsTheCacheOutlastsTheBlocks) {
  RecordingBlocks blocks(upstream);
  void* a = blocks.allocate(2 * kKiB, 2 * kKiB, kRounding, kDefaultStream);
  blocks.free(a, false);
  const RecordingBlockFigures f = blocks.figures();
  EXPECT_EQ(f.live_raw_bytes, 0u);
  EXPECT_EQ(f.held_bytes, 0u);
  EXPECT_EQ(f.peak_live_raw_bytes, raw(2 * kKiB));
}

}  // namespace
}  // namespace sdalloc::planned_arena_detail
