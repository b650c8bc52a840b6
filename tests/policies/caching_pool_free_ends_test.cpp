// CachingPool's free ends: before growing past its peak, a pool cuts the free pages at the
// front or end of segments that still hold live blocks off them (MemoryResource::split) and
// gives them to the new segment, beside the wholly free segments release before growth
// gives (include/sdalloc/policies/caching_pool.hpp, "Free ends").
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "policies/caching_pool_on_host.hpp"
#include "sdalloc/core/errors.hpp"
#include "sdalloc/resources/segments_only_resource.hpp"
#include "support/fault_injection.hpp"
#include "support/mapped_pages.hpp"

namespace sdalloc {
namespace {

using test::bytes_of;
using test::large_pool_options;
using test::MiB;

// A 6 MiB segment whose only live block is `kept` (1 MiB, at the segment's start or, with
// `at_end`, at its end), the other 5 MiB free and written with 0x41; then an 8 MiB request,
// which grows the pool past its 6 MiB peak. With the cut, the free 5 MiB go to the new
// segment: 1 + 8 MiB held. Without it: 6 + 8.
struct GrownBesideAKeptBlock {
  GrownBesideAKeptBlock(MemoryResource& upstream, CachingPoolOptions options, bool at_end)
      : pool(upstream, options) {
    void* whole = pool.allocate(6 * MiB);
    std::memset(whole, 0x41, 6 * MiB);
    pool.free(whole);
    if (at_end) {
      void* front = pool.allocate(5 * MiB);
      kept = pool.allocate(MiB);
      pool.free(front);
    } else {
      kept = pool.allocate(MiB);
    }
    std::memset(kept, 0x6b, MiB);
    grown = pool.allocate(8 * MiB);
  }
  bool kept_intact() const {
    for (std::size_t i = 0; i < MiB; i += 4096) {
      if (bytes_of(kept)[i] != 0x6b || bytes_of(kept)[i + 4095] != 0x6b) return false;
    }
    return true;
  }
  // Pages of the grown block that carry the cut end's contents (moved, not fresh).
  std::size_t moved_pages() const {
    std::size_t moved = 0;
    for (std::size_t i = 0; i < 8 * MiB; i += 4096) moved += bytes_of(grown)[i] == 0x41 ? 1 : 0;
    return moved;
  }
  CachingPool pool;
  void* kept = nullptr;
  void* grown = nullptr;
};

class CachingPoolFreeEnds : public test::CachingPoolOnHost,
                            public ::testing::WithParamInterface<bool> {};

TEST_P(CachingPoolFreeEnds, TheFreeEndOfAUsedSegmentFeedsTheNewSegment) {
  const bool at_end = GetParam();
  GrownBesideAKeptBlock run(upstream_, large_pool_options(), at_end);
  const PoolStats s = run.pool.stats();
  EXPECT_EQ(s.reserved_bytes, 9 * MiB) << "the kept block's 1 MiB and the 8 MiB segment";
  EXPECT_EQ(s.peak_reserved_bytes, 9 * MiB);
  EXPECT_EQ(s.segments, 2u);
  EXPECT_EQ(s.segment_splits, 1u);
  EXPECT_EQ(s.spare_bytes, 0u);
  EXPECT_EQ(upstream_.stats().current_bytes, 9 * MiB);
  EXPECT_EQ(upstream_.stats().peak_bytes, 9 * MiB) << "never 6 + 8 MiB held at once";
  EXPECT_EQ(run.moved_pages(), 5 * MiB / 4096) << "the cut's pages moved into the new segment";
  EXPECT_TRUE(run.kept_intact()) << "the kept block lies where it was, its bytes unchanged";
  run.pool.check_invariants();

  // The trimmed segment still works as one: its block is freed, served again, released.
  run.pool.free(run.kept);
  void* again = run.pool.allocate(MiB);
  EXPECT_EQ(run.pool.stats().reserved_bytes, 9 * MiB);
  run.pool.free(again);
  run.pool.free(run.grown);
  run.pool.check_invariants();
  EXPECT_EQ(run.pool.trim(), 9 * MiB);
  EXPECT_EQ(upstream_.stats().current_bytes, 0u) << "every cut range went back";
  EXPECT_EQ(upstream_.stats().current_count, 0u);
}

INSTANTIATE_TEST_SUITE_P(FrontAndEnd, CachingPoolFreeEnds, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& param) {
                           return std::string(param.param ? "KeptAtTheEnd" : "KeptAtTheFront");
                         });

class CachingPoolFreeEndRules : public test::CachingPoolOnHost {};

TEST_F(CachingPoolFreeEndRules, FreeEndsAreCutInASmallPoolTooButNotWhenTurnedOff) {
  CachingPoolOptions small;  // the default small_pool_limit: 14 MiB is a small pool
  GrownBesideAKeptBlock in_small(upstream_, small, /*at_end=*/false);
  EXPECT_EQ(in_small.pool.stats().segment_splits, 1u);
  EXPECT_EQ(in_small.pool.stats().reserved_bytes, 9 * MiB);
  EXPECT_TRUE(in_small.kept_intact());
  in_small.pool.check_invariants();

  CachingPoolOptions off = large_pool_options();
  off.cut_free_ends = false;
  GrownBesideAKeptBlock turned_off(upstream_, off, /*at_end=*/false);
  EXPECT_EQ(turned_off.pool.stats().segment_splits, 0u);
  EXPECT_EQ(turned_off.pool.stats().reserved_bytes, 14 * MiB);
  EXPECT_TRUE(turned_off.kept_intact());
  turned_off.pool.check_invariants();
}

// An arena (a consolidated segment) keeps its free end when the pool grows beside it, but
// for a small pool's, which is often made while the work is a fraction of its later size.
// The arena here cannot grow in place (grow_arena off), so a larger request takes a new
// segment.
TEST_F(CachingPoolFreeEndRules, OnlyASmallPoolsArenaGivesItsFreeEnd) {
  for (const bool small : {true, false}) {
    CachingPoolOptions options = small ? CachingPoolOptions{} : large_pool_options();
    options.grow_arena = false;
    CachingPool pool(upstream_, options);
    test::churn_to_an_empty_stream(pool, MiB);
    void* kept = pool.allocate(MiB / 4);  // consolidates first: the arena's only block
    ASSERT_EQ(pool.stats().consolidations, 1u) << small;
    ASSERT_EQ(pool.stats().segments, 1u) << small;
    const std::size_t arena = pool.stats().reserved_bytes;
    ASSERT_GE(arena, 5 * MiB / 2) << small;
    std::memset(kept, 0x6b, MiB / 4);
    const std::uint64_t splits = pool.stats().segment_splits;
    void* grown = pool.allocate(4 * MiB);  // past the arena: a new segment
    const PoolStats s = pool.stats();
    if (small) {
      EXPECT_EQ(s.segment_splits, splits + 1);
      EXPECT_EQ(s.reserved_bytes, MiB / 4 + 4 * MiB) << "the arena's free end went to it";
    } else {
      EXPECT_EQ(s.segment_splits, splits);
      EXPECT_EQ(s.reserved_bytes, arena + 4 * MiB);
    }
    EXPECT_EQ(bytes_of(kept)[MiB / 4 - 1], 0x6b) << small;
    pool.check_invariants();
    pool.free(grown);
    pool.free(kept);
    pool.check_invariants();
  }
}

// A resource that maps pages of `page` bytes and refuses every split (or, with `splits`,
// forwards them): where it refuses, or its pages are as coarse as the segment granularity
// (CUDA's 2 MiB), the pool cuts nothing and grows as it would
// without the rule.
class PagedResource final : public MemoryResource {
 public:
  PagedResource(MemoryResource& upstream, std::size_t page, bool splits)
      : upstream_(upstream), page_(page), splits_(splits) {}
  std::size_t page_size() const override { return page_; }
  bool can_coalesce() const override { return upstream_.can_coalesce(); }
  std::string name() const override { return "no-split(" + upstream_.name() + ")"; }

 private:
  void* do_allocate(std::size_t bytes, Stream stream) override {
    return upstream_.allocate(bytes, stream);
  }
  void do_deallocate(void* ptr, std::size_t bytes, Stream stream) override {
    upstream_.deallocate(ptr, bytes, stream);
  }
  void* do_coalesce(std::span<const ResourceRange> ranges, std::size_t bytes,
                    Stream stream) override {
    return upstream_.coalesce(ranges, bytes, stream);
  }
  bool do_split(void* ptr, std::size_t bytes, std::size_t first) override {
    return splits_ && upstream_.split(ptr, bytes, first);
  }
  MemoryResource& upstream_;
  std::size_t page_;
  bool splits_;
};

TEST_F(CachingPoolFreeEndRules, AResourceThatCannotCutKeepsItsSegmentsWhole) {
  PagedResource refusing(upstream_, 4096, /*splits=*/false);
  GrownBesideAKeptBlock refused(refusing, large_pool_options(), /*at_end=*/true);
  EXPECT_EQ(refused.pool.stats().segment_splits, 0u);
  EXPECT_EQ(refused.pool.stats().reserved_bytes, 14 * MiB);
  EXPECT_TRUE(refused.kept_intact());
  refused.pool.check_invariants();

  PagedResource splitting(upstream_, 4096, /*splits=*/true);  // the same, splitting: cut
  GrownBesideAKeptBlock cut(splitting, large_pool_options(), /*at_end=*/true);
  EXPECT_EQ(cut.pool.stats().reserved_bytes, 9 * MiB);

  PagedResource chunked(upstream_, 2 * MiB, /*splits=*/true);  // pages of the granularity
  GrownBesideAKeptBlock whole(chunked, large_pool_options(), /*at_end=*/true);
  EXPECT_EQ(whole.pool.stats().segment_splits, 0u);
  EXPECT_EQ(whole.pool.stats().reserved_bytes, 14 * MiB);
  whole.pool.check_invariants();

  SegmentsOnlyResource device_like(host_);  // no page size: as a GPU's memory
  GrownBesideAKeptBlock on_device(device_like, large_pool_options(), /*at_end=*/true);
  EXPECT_EQ(on_device.pool.stats().segment_splits, 0u);
  EXPECT_EQ(on_device.pool.stats().reserved_bytes, 14 * MiB);
  on_device.pool.check_invariants();
}

// The new segment is refused after the cut: the cut pages went back with the coalesce (as
// it promises), the pool retries once, and the kept block and the pool's books are intact.
TEST_F(CachingPoolFreeEndRules, ARefusedGrowthAfterACutLeavesThePoolConsistent) {
  test::FaultPlan plan;
  test::FaultInjectingResource faulty(upstream_, plan);
  CachingPool pool(faulty, large_pool_options());
  void* whole = pool.allocate(6 * MiB);
  pool.free(whole);
  void* kept = pool.allocate(MiB);
  std::memset(kept, 0x6b, MiB);
  plan.count_only({test::ResourceCall::kCoalesce, test::ResourceCall::kAllocate});
  plan.fail_call(0);                     // the coalesce into the new segment
  void* grown = pool.allocate(8 * MiB);  // the retry's plain allocate serves it
  EXPECT_EQ(plan.failures(), 1u);
  EXPECT_EQ(pool.stats().segment_splits, 1u);
  EXPECT_EQ(pool.stats().reserved_bytes, 9 * MiB);
  EXPECT_EQ(upstream_.stats().current_bytes, 9 * MiB) << "the cut pages went back";
  EXPECT_EQ(bytes_of(kept)[MiB - 1], 0x6b);
  pool.check_invariants();

  pool.free(grown);
  // Every call refused now (the coalesce, then the retry's allocate): a typed error, and
  // nothing lost.
  plan.fail_randomly(65535, 7);
  EXPECT_THROW(pool.allocate(32 * MiB), OutOfMemory);
  plan.disarm();
  EXPECT_EQ(bytes_of(kept)[0], 0x6b);
  pool.check_invariants();
  pool.free(kept);
  pool.check_invariants();
}

}  // namespace
}  // namespace sdalloc
