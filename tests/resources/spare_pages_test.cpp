// Spare pages: a resource splits a range it handed out in two (HostResource, the adaptors),
// and CachingPool keeps the released segments' pages a new segment does not need, for the
// next one, without ever holding more than its segments' peak.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/policies/caching_pool.hpp"
#include "sdalloc/resources/host_resource.hpp"
#include "sdalloc/resources/limit_resource.hpp"
#include "sdalloc/resources/segments_only_resource.hpp"
#include "sdalloc/resources/stats_resource.hpp"
#include "support/mapped_pages.hpp"

namespace sdalloc {
namespace {

using test::bytes_of;
using test::is_unmapped;

constexpr std::size_t kPage = HostResource::kPageSize;
constexpr std::size_t kMiB = std::size_t{1} << 20;

// ---------------------------------------------------------------------------------------
// split

TEST(SplitTest, HostPartsAreReturnedEachOnItsOwn) {
  HostResource host;
  void* a = host.allocate(4 * kMiB);
  std::memset(a, 0x31, 4 * kMiB);
  ASSERT_TRUE(host.split(a, 4 * kMiB, kMiB));
  void* tail = bytes_of(a) + kMiB;
  host.deallocate(a, kMiB);
  EXPECT_TRUE(is_unmapped(a, kMiB));
  EXPECT_EQ(bytes_of(tail)[0], 0x31) << "the other part is still there";
  // The tail can go into a coalesce like any range.
  const ResourceRange ranges[] = {{tail, 3 * kMiB}};
  void* merged = host.coalesce(ranges, 3 * kMiB);
  EXPECT_EQ(bytes_of(merged)[3 * kMiB - 1], 0x31);
  host.deallocate(merged, 3 * kMiB);
}

TEST(SplitTest, OnlyAPageBoundaryInsideTheRangeIsACut) {
  HostResource host;
  void* a = host.allocate(2 * kMiB);
  EXPECT_FALSE(host.split(a, 2 * kMiB, 0));
  EXPECT_FALSE(host.split(a, 2 * kMiB, 2 * kMiB));
  EXPECT_FALSE(host.split(a, 2 * kMiB, 3 * kMiB));
  EXPECT_FALSE(host.split(a, 2 * kMiB, kPage + 512));
  EXPECT_FALSE(host.split(nullptr, 2 * kMiB, kPage));
  host.deallocate(a, 2 * kMiB);  // still one range
}

TEST(SplitTest, AdaptorsForwardAndKeepTheirBooks) {
  HostResource host;
  LimitResource cap(host, 8 * kMiB);
  StatsResource stats(cap);
  void* a = stats.allocate(4 * kMiB);
  ASSERT_TRUE(stats.split(a, 4 * kMiB, 3 * kMiB));
  EXPECT_EQ(stats.stats().current_count, 2u);
  EXPECT_EQ(stats.stats().peak_count, 2u);
  EXPECT_EQ(stats.stats().current_bytes, 4 * kMiB) << "a split changes no byte";
  EXPECT_EQ(cap.used(), 4 * kMiB);
  stats.deallocate(bytes_of(a) + 3 * kMiB, kMiB);
  stats.deallocate(a, 3 * kMiB);
  EXPECT_EQ(stats.stats().current_count, 0u);
  EXPECT_EQ(stats.stats().current_bytes, 0u);
  EXPECT_EQ(cap.used(), 0u);
}

TEST(SplitTest, AResourceThatCannotRefusesAndNothingChanges) {
  HostResource plain_host;
  SegmentsOnlyResource plain(plain_host);  // as a GPU's: no split, grow or coalesce
  StatsResource stats(plain);
  void* a = stats.allocate(2 * kMiB);
  EXPECT_FALSE(stats.split(a, 2 * kMiB, kMiB));
  EXPECT_EQ(stats.stats().current_count, 1u);
  stats.deallocate(a, 2 * kMiB);
}

// ---------------------------------------------------------------------------------------
// CachingPool's spare pages

CachingPoolOptions plain_options() {
  CachingPoolOptions options;
  options.small_pool_limit = 0;  // 2 MiB segments from the start
  options.huge_threshold = 64 * kMiB;
  return options;
}

// Two 6 MiB segments, freed; a 10 MiB request must grow past the 12 MiB peak, so both are
// released: one gives all its pages, the other the 4 MiB still lacking, and its last 2 MiB
// are kept aside.
struct ReleasedToGrow {
  explicit ReleasedToGrow(MemoryResource& upstream, CachingPoolOptions options = plain_options())
      : pool(upstream, options) {
    void* a = pool.allocate(6 * kMiB);
    void* b = pool.allocate(6 * kMiB);
    std::memset(a, 0x41, 6 * kMiB);
    std::memset(b, 0x42, 6 * kMiB);
    pool.free(a);
    pool.free(b);
    c = pool.allocate(10 * kMiB);
  }
  CachingPool pool;
  void* c = nullptr;
};

TEST(SparePagesTest, WhatTheNewSegmentDoesNotNeedIsKeptAside) {
  HostResource host;
  StatsResource counted(host);
  ReleasedToGrow grown(counted);
  const PoolStats s = grown.pool.stats();
  EXPECT_EQ(s.spare_bytes, 2 * kMiB);
  EXPECT_EQ(s.reserved_bytes, 12 * kMiB) << "spare pages are held, and counted";
  EXPECT_EQ(s.peak_reserved_bytes, 12 * kMiB) << "never above the segments' peak";
  EXPECT_EQ(s.free_bytes, 0u) << "no block is carved from spare pages";
  EXPECT_EQ(s.segments, 2u) << "the 10 MiB segment and the spare part";
  EXPECT_EQ(s.segment_splits, 1u);
  EXPECT_EQ(counted.stats().current_bytes, 12 * kMiB);
  EXPECT_EQ(counted.stats().current_count, 2u);
  // Moved, not fresh: the new segment is made of the old ones' pages.
  std::size_t moved = 0;
  for (std::size_t off = 0; off < 10 * kMiB; off += kPage) {
    const unsigned char v = bytes_of(grown.c)[off];
    moved += (v == 0x41 || v == 0x42) ? 1 : 0;
  }
  EXPECT_EQ(moved, 10 * kMiB / kPage);
  grown.pool.check_invariants();
}

TEST(SparePagesTest, TheNextSegmentTakesThemFirst) {
  HostResource host;
  StatsResource counted(host);
  ReleasedToGrow grown(counted);
  // 10 MiB of segments + 2 MiB is within the peak: no release, and the 2 MiB spare feed it.
  void* d = grown.pool.allocate(2 * kMiB);
  const PoolStats s = grown.pool.stats();
  EXPECT_EQ(s.spare_bytes, 0u);
  EXPECT_EQ(s.reserved_bytes, 12 * kMiB);
  EXPECT_EQ(s.peak_reserved_bytes, 12 * kMiB);
  const unsigned char first = bytes_of(d)[0];
  const unsigned char last = bytes_of(d)[2 * kMiB - 1];
  EXPECT_TRUE((first == 0x41 || first == 0x42) && last == first)
      << "the spare pages, not fresh ones: " << int{first} << ", " << int{last};
  EXPECT_EQ(counted.stats().peak_bytes, 12 * kMiB);
  grown.pool.check_invariants();
  grown.pool.free(d);
  grown.pool.free(grown.c);
}

TEST(SparePagesTest, TrimReturnsThem) {
  HostResource host;
  StatsResource counted(host);
  ReleasedToGrow grown(counted);
  EXPECT_EQ(grown.pool.trim(), 2 * kMiB);
  EXPECT_EQ(grown.pool.stats().spare_bytes, 0u);
  EXPECT_EQ(grown.pool.stats().reserved_bytes, 10 * kMiB);
  EXPECT_EQ(counted.stats().current_bytes, 10 * kMiB);
  grown.pool.check_invariants();
  grown.pool.free(grown.c);
}

TEST(SparePagesTest, TheArenaTakesThemWhenTheStreamEmpties) {
  HostResource host;
  StatsResource counted(host);
  ReleasedToGrow grown(counted);
  grown.pool.free(grown.c);
  void* d = grown.pool.allocate(kMiB);  // consolidates: 10 MiB segment + 2 MiB spare
  const PoolStats s = grown.pool.stats();
  EXPECT_EQ(s.consolidations, 1u);
  EXPECT_EQ(s.spare_bytes, 0u);
  EXPECT_EQ(s.segments, 1u);
  EXPECT_EQ(counted.stats().current_count, 1u);
  grown.pool.check_invariants();
  grown.pool.free(d);
}

TEST(SparePagesTest, UnderACapTheyCountAndFeedTheNextSegment) {
  HostResource host;
  LimitResource cap(host, 14 * kMiB);
  ReleasedToGrow grown(cap);  // 12 MiB held, 2 MiB of it spare
  EXPECT_EQ(cap.used(), 12 * kMiB);
  // A 4 MiB segment: the 2 MiB spare and 2 MiB fresh, 14 MiB in all.
  void* d = grown.pool.allocate(4 * kMiB);
  EXPECT_EQ(cap.used(), 14 * kMiB);
  EXPECT_EQ(grown.pool.stats().spare_bytes, 0u);
  // Nothing is left to give: the next request is refused with a typed error, and the pool
  // is unchanged.
  EXPECT_THROW(grown.pool.allocate(2 * kMiB), OutOfMemory);
  EXPECT_EQ(grown.pool.stats().reserved_bytes, 14 * kMiB);
  grown.pool.check_invariants();
  grown.pool.free(d);
  grown.pool.free(grown.c);
}

TEST(SparePagesTest, TurnedOffOrOverAResourceThatCannotMovePagesNoneAreKept) {
  HostResource host;
  CachingPoolOptions off = plain_options();
  off.keep_spare_pages = false;
  ReleasedToGrow without(host, off);
  EXPECT_EQ(without.pool.stats().spare_bytes, 0u);
  EXPECT_EQ(without.pool.stats().reserved_bytes, 10 * kMiB);
  without.pool.check_invariants();

  HostResource plain_host;
  SegmentsOnlyResource plain(plain_host);  // as a GPU's: no split, grow or coalesce
  ReleasedToGrow over_plain(plain);
  EXPECT_EQ(over_plain.pool.stats().spare_bytes, 0u);
  EXPECT_EQ(over_plain.pool.stats().reserved_bytes, 10 * kMiB);
  over_plain.pool.check_invariants();
}

}  // namespace
}  // namespace sdalloc
