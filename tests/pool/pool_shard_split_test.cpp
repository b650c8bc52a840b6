// pool_shard_split_test.cpp - PoolShard::split_segment and free_pages, the books behind
// CachingPool's stitching (a segment cut in two around a run of free pages).
//
// Segments have made-up addresses: the shard only does arithmetic on them, never touches
// them.

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>

#include "pool/block.hpp"
#include "pool/pool_shard.hpp"

namespace sdalloc::detail {
namespace {

constexpr std::uintptr_t kBase = std::uintptr_t{1} << 32;
constexpr std::size_t kKiB = 1024;
constexpr std::size_t kPage = 64 * kKiB;

Fit fit_of(std::size_t bytes) {
  Fit fit;
  fit.rounded = bytes;
  fit.alignment = kBlockRounding;
  fit.needed = bytes;
  return fit;
}

// One 1 MiB segment tiled as [a 256 KiB][b 256 KiB][c 256 KiB][free 256 KiB], b then freed:
// free blocks at [256, 512) and [768, 1024) KiB.
class PoolShardSplit : public ::testing::Test {
 protected:
  void SetUp() override {
    segment_ = new Segment{};
    segment_->base = kBase;
    segment_->size = 1024 * kKiB;
    segment_->used = true;
    segment_->arena = true;
    shard_.add_segment(segment_);
    a_ = shard_.allocate(fit_of(256 * kKiB), 256 * kKiB);
    Block* b = shard_.allocate(fit_of(256 * kKiB), 256 * kKiB);
    c_ = shard_.allocate(fit_of(256 * kKiB), 256 * kKiB);
    ASSERT_NE(a_, nullptr);
    ASSERT_NE(b, nullptr);
    ASSERT_NE(c_, nullptr);
    ASSERT_EQ(b->addr, kBase + 256 * kKiB);
    shard_.forget_live(b);
    shard_.make_free(b);
  }
  void TearDown() override {
    for (Segment* s = shard_.segments; s != nullptr;) {
      Segment* next = s->next;
      for (Block* b = s->first; b != nullptr;) {
        Block* after = b->next;
        if (b->indexed) shard_.index_of(b).erase(b);
        if (!b->free) shard_.forget_live(b);
        shard_.records.give_back(b);
        b = after;
      }
      delete s;
      s = next;
    }
  }
  std::size_t check() const {
    std::size_t reserved = 0;
    shard_.check(reserved);
    return reserved;
  }

  PoolShard shard_{Stream{}};
  Segment* segment_ = nullptr;
  Block* a_ = nullptr;
  Block* c_ = nullptr;
};

TEST_F(PoolShardSplit, FreePagesCountWholePagesInFreeBlocks) {
  EXPECT_EQ(shard_.free_pages(segment_, kPage), 512 * kKiB);
  EXPECT_EQ(shard_.free_pages(segment_, 384 * kKiB), 0u) << "no free block covers a whole page";
}

TEST_F(PoolShardSplit, InsideAFreeBlockTheBlockIsCutInTwo) {
  auto* upper = new Segment{};
  shard_.records.reserve(1);
  shard_.split_segment(segment_, kBase + 384 * kKiB, upper, shard_.records.take());
  EXPECT_EQ(segment_->size, 384 * kKiB);
  EXPECT_EQ(upper->base, kBase + 384 * kKiB);
  EXPECT_EQ(upper->size, 640 * kKiB);
  EXPECT_TRUE(upper->arena) << "the upper part is of the same kind";
  EXPECT_TRUE(upper->used);
  EXPECT_EQ(segment_->next, upper);
  EXPECT_EQ(shard_.figures.segments, 2u);
  EXPECT_EQ(check(), 1024 * kKiB) << "the reserved bytes do not change";
  EXPECT_EQ(c_->segment, upper) << "the live block above the cut moved with it";
  EXPECT_EQ(a_->segment, segment_);
  EXPECT_EQ(PoolShard::last_block(segment_)->size, 128 * kKiB);
  EXPECT_TRUE(upper->first->indexed);
  EXPECT_EQ(upper->first->size, 128 * kKiB);
  // Both halves of the free block serve requests.
  EXPECT_NE(shard_.allocate(fit_of(128 * kKiB), 128 * kKiB), nullptr);
  EXPECT_NE(shard_.allocate(fit_of(128 * kKiB), 128 * kKiB), nullptr);
  check();
}

TEST_F(PoolShardSplit, AtTheStartOfALiveBlockNothingIsCut) {
  auto* upper = new Segment{};
  shard_.records.reserve(1);
  const std::size_t free_blocks = shard_.normal.count();
  shard_.split_segment(segment_, c_->addr, upper, shard_.records.take());
  EXPECT_EQ(upper->first, c_);
  EXPECT_EQ(c_->prev, nullptr);
  EXPECT_FALSE(c_->indexed) << "a live block stays out of the free index";
  EXPECT_EQ(shard_.normal.count(), free_blocks);
  EXPECT_EQ(segment_->size, 512 * kKiB);
  EXPECT_EQ(check(), 1024 * kKiB);
  // The lower part's free end is then trimmed, as CachingPool's cut does.
  EXPECT_EQ(shard_.free_end(segment_, kPage, /*front=*/false), 256 * kKiB);
  shard_.trim_segment(segment_, 256 * kKiB, /*front=*/false);
  EXPECT_EQ(segment_->size, 256 * kKiB);
  EXPECT_EQ(check(), 768 * kKiB);
  EXPECT_EQ(shard_.free_pages(upper, kPage), 256 * kKiB);
}

}  // namespace
}  // namespace sdalloc::detail
