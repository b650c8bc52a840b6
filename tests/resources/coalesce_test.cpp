// coalesce: HostResource moves the returned ranges' pages into the new range, the adaptors
// forward it with their books kept, and every other resource does deallocate + allocate.
// (The contract every resource keeps is checked by the conformance suite; this file checks
// what each implementation does inside.)
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/bits.hpp"
#include "sdalloc/core/errors.hpp"
#include "sdalloc/policies/caching_pool.hpp"
#include "sdalloc/resources/host_resource.hpp"
#include "sdalloc/resources/limit_resource.hpp"
#include "sdalloc/resources/stats_resource.hpp"
#include "support/mapped_pages.hpp"

namespace sdalloc {
namespace {

using test::is_unmapped;

constexpr std::size_t kPage = HostResource::kPageSize;
constexpr std::size_t kMiB = std::size_t{1} << 20;

unsigned char* bytes_of(void* ptr) { return static_cast<unsigned char*>(ptr); }

// Pages of [ptr, ptr + bytes) that are resident now.
std::size_t resident_pages(void* ptr, std::size_t bytes) {
  std::vector<unsigned char> residency((bytes + kPage - 1) / kPage);
  if (::mincore(ptr, bytes, residency.data()) != 0) return 0;
  std::size_t resident = 0;
  for (const unsigned char page : residency) resident += page & 1;
  return resident;
}

// Pages of [ptr, ptr + bytes) whose every byte is `value` (one byte per 512 is read).
std::size_t pages_holding(const void* ptr, std::size_t bytes, unsigned char value) {
  const auto* data = static_cast<const unsigned char*>(ptr);
  std::size_t count = 0;
  for (std::size_t page = 0; page + kPage <= bytes; page += kPage) {
    bool all = true;
    for (std::size_t i = 0; i < kPage && all; i += 512) all = data[page + i] == value;
    count += all ? 1 : 0;
  }
  return count;
}

// Counts what reaches it and passes it on; no coalesce of its own.
class CountingResource final : public MemoryResource {
 public:
  explicit CountingResource(MemoryResource& upstream) : upstream_(upstream) {}
  std::string name() const override { return "counting"; }
  std::vector<std::string> calls;

 private:
  void* do_allocate(std::size_t bytes, Stream stream) override {
    calls.push_back("allocate " + std::to_string(bytes));
    return upstream_.allocate(bytes, stream);
  }
  void do_deallocate(void* ptr, std::size_t bytes, Stream stream) override {
    calls.push_back("deallocate " + std::to_string(bytes));
    upstream_.deallocate(ptr, bytes, stream);
  }
  MemoryResource& upstream_;
};

// ---------------------------------------------------------------------------------------
// HostResource

TEST(HostCoalesceTest, MovesEachRangesPagesIntoTheNewRangeInOrder) {
  for (const bool huge : {false, true}) {
    HostResource host(HostResourceOptions{.transparent_huge_pages = huge});
    const std::size_t sizes[] = {2 * kMiB, 2 * kMiB + 100, 4 * kMiB};
    std::vector<ResourceRange> ranges;
    for (std::size_t i = 0; i < 3; ++i) {
      void* ptr = host.allocate(sizes[i]);
      std::memset(ptr, 0xA0 + static_cast<int>(i), sizes[i]);
      ranges.push_back({ptr, sizes[i]});
    }
    const std::size_t bytes = 12 * kMiB;
    void* merged = host.coalesce(ranges, bytes);
    ASSERT_NE(merged, nullptr);
    if (huge) {
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(merged) % HostResource::kHugePageSize, 0u);
    }
    // Each range at the next page (the next 2 MiB with huge pages), its bytes intact.
    std::size_t offset = 0;
    for (std::size_t i = 0; i < 3; ++i) {
      if (huge) offset = round_up(offset, HostResource::kHugePageSize);
      const auto value = static_cast<unsigned char>(0xA0 + i);
      EXPECT_EQ(pages_holding(bytes_of(merged) + offset, sizes[i], value), sizes[i] / kPage)
          << "range " << i << (huge ? " (thp)" : "");
      EXPECT_TRUE(is_unmapped(ranges[i].ptr, sizes[i])) << "range " << i << " still mapped";
      offset += round_up(sizes[i], kPage);
    }
    // The rest is fresh memory, and all of it is writable.
    EXPECT_EQ(pages_holding(bytes_of(merged) + offset, bytes - offset, 0),
              (bytes - offset) / kPage);
    std::memset(merged, 1, bytes);
    host.deallocate(merged, bytes);
    EXPECT_TRUE(is_unmapped(merged, bytes));
  }
}

TEST(HostCoalesceTest, MovedPagesStayResident) {
  HostResource host;
  void* a = host.allocate(4 * kMiB);
  std::memset(a, 7, 4 * kMiB);  // faulted in
  const ResourceRange ranges[] = {{a, 4 * kMiB}};
  void* merged = host.coalesce(ranges, 8 * kMiB);
  EXPECT_EQ(resident_pages(merged, 4 * kMiB), 4 * kMiB / kPage);
  EXPECT_EQ(resident_pages(bytes_of(merged) + 4 * kMiB, 4 * kMiB), 0u) << "not touched yet";
  host.deallocate(merged, 8 * kMiB);
}

TEST(HostCoalesceTest, ARangeThatDoesNotFitIsCutAndItsTailUnmapped) {
  HostResource host;
  void* a = host.allocate(3 * kMiB);
  void* b = host.allocate(3 * kMiB);
  std::memset(a, 0x11, 3 * kMiB);
  std::memset(b, 0x22, 3 * kMiB);
  const ResourceRange ranges[] = {{a, 3 * kMiB}, {b, 3 * kMiB}};
  void* merged = host.coalesce(ranges, 4 * kMiB);
  EXPECT_EQ(pages_holding(merged, 3 * kMiB, 0x11), 3 * kMiB / kPage);
  EXPECT_EQ(pages_holding(bytes_of(merged) + 3 * kMiB, kMiB, 0x22), kMiB / kPage);
  EXPECT_TRUE(is_unmapped(a, 3 * kMiB));
  EXPECT_TRUE(is_unmapped(b, 3 * kMiB));
  host.deallocate(merged, 4 * kMiB);
}

TEST(HostCoalesceTest, ARangeMadeOfSeveralMappingsMovesWhole) {
  // A coalesced range is several kernel mappings (moved pages keep theirs); coalescing it
  // again must move all of them.
  HostResource host;
  std::vector<ResourceRange> first;
  for (int i = 0; i < 4; ++i) {
    void* ptr = host.allocate(kMiB);
    std::memset(ptr, 0x30 + i, kMiB);
    first.push_back({ptr, kMiB});
  }
  void* once = host.coalesce(first, 6 * kMiB);
  std::memset(bytes_of(once) + 4 * kMiB, 0x40, 2 * kMiB);
  const ResourceRange again[] = {{once, 6 * kMiB}};
  void* twice = host.coalesce(again, 6 * kMiB);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(pages_holding(bytes_of(twice) + i * kMiB, kMiB, static_cast<unsigned char>(0x30 + i)),
              kMiB / kPage)
        << i;
  }
  EXPECT_EQ(pages_holding(bytes_of(twice) + 4 * kMiB, 2 * kMiB, 0x40), 2 * kMiB / kPage);
  EXPECT_TRUE(is_unmapped(once, 6 * kMiB));
  host.deallocate(twice, 6 * kMiB);
}

TEST(HostCoalesceTest, ZeroBytesReturnsTheRangesAndHandsOutNothing) {
  HostResource host;
  void* a = host.allocate(kMiB);
  const ResourceRange ranges[] = {{a, kMiB}, {nullptr, 0}};
  EXPECT_EQ(host.coalesce(ranges, 0), nullptr);
  EXPECT_TRUE(is_unmapped(a, kMiB));
  EXPECT_EQ(host.coalesce({}, 0), nullptr);
}

TEST(HostCoalesceTest, RefusedNewRangeStillReturnsTheRanges) {
  HostResource host;
  void* a = host.allocate(kMiB);
  const ResourceRange ranges[] = {{a, kMiB}};
  EXPECT_THROW(host.coalesce(ranges, ~std::size_t{0} - kMiB), OutOfMemory);
  EXPECT_TRUE(is_unmapped(a, kMiB));
}

TEST(HostCoalesceTest, PopulateFaultsInWhatNoRangeCovered) {
  HostResource host(HostResourceOptions{.populate = true});
  void* a = host.allocate(kMiB);
  const ResourceRange ranges[] = {{a, kMiB}};
  void* merged = host.coalesce(ranges, 4 * kMiB);
  EXPECT_EQ(resident_pages(merged, 4 * kMiB), 4 * kMiB / kPage);
  host.deallocate(merged, 4 * kMiB);
}

// ---------------------------------------------------------------------------------------
// the adaptors and the default

TEST(CoalesceAdaptorTest, LimitAndStatsForwardToAHostAndKeepTheirBooks) {
  HostResource host;
  StatsResource below(host);
  LimitResource cap(below, 8 * kMiB);
  StatsResource above(cap);
  EXPECT_TRUE(above.can_coalesce());
  void* a = above.allocate(3 * kMiB);
  void* b = above.allocate(3 * kMiB);
  std::memset(a, 0x55, 3 * kMiB);
  const ResourceRange ranges[] = {{a, 3 * kMiB}, {b, 3 * kMiB}};
  // 6 MiB held under an 8 MiB cap: 7 MiB fit only because the ranges' bytes are released.
  void* merged = above.coalesce(ranges, 7 * kMiB);
  EXPECT_EQ(pages_holding(merged, 3 * kMiB, 0x55), 3 * kMiB / kPage) << "pages moved";
  EXPECT_EQ(cap.used(), 7 * kMiB);
  for (const StatsResource* stats : {&above, &below}) {
    const ResourceStats s = stats->stats();
    EXPECT_EQ(s.current_bytes, 7 * kMiB);
    EXPECT_EQ(s.current_count, 1u);
    EXPECT_EQ(s.peak_bytes, 7 * kMiB);
    EXPECT_EQ(s.allocations, 3u);
    EXPECT_EQ(s.deallocations, 2u);
    EXPECT_EQ(s.failures, 0u);
  }
  // Past the cap: refused, and the range still goes back.
  const ResourceRange all[] = {{merged, 7 * kMiB}};
  EXPECT_THROW(above.coalesce(all, 9 * kMiB), OutOfMemory);
  EXPECT_TRUE(is_unmapped(merged, 7 * kMiB));
  EXPECT_EQ(cap.used(), 0u);
  EXPECT_EQ(below.stats().current_bytes, 0u);
  EXPECT_EQ(above.stats().current_bytes, 0u);
  EXPECT_EQ(above.stats().failures, 1u);
  EXPECT_EQ(above.stats().deallocations, 3u);
}

TEST(CoalesceAdaptorTest, DefaultIsDeallocateOfEachRangeThenAllocate) {
  HostResource host;
  CountingResource counting(host);
  StatsResource stats(counting);
  EXPECT_FALSE(counting.can_coalesce());
  EXPECT_FALSE(stats.can_coalesce()) << "an adaptor coalesces only where its upstream does";
  void* a = stats.allocate(kMiB);
  void* b = stats.allocate(2 * kMiB);
  const ResourceRange ranges[] = {{a, kMiB}, {b, 2 * kMiB}};
  void* merged = stats.coalesce(ranges, 4 * kMiB);
  const std::vector<std::string> expected = {"allocate 1048576", "allocate 2097152",
                                             "deallocate 1048576", "deallocate 2097152",
                                             "allocate 4194304"};
  EXPECT_EQ(counting.calls, expected);
  EXPECT_EQ(stats.stats().current_bytes, 4 * kMiB);
  stats.deallocate(merged, 4 * kMiB);
}

// ---------------------------------------------------------------------------------------
// CachingPool over host memory: growth and consolidation keep the pages faulted in

TEST(CoalescingPoolTest, GrowthAndConsolidationMoveThePagesTheWorkFaultedIn) {
  HostResource host;
  StatsResource counted(host);
  CachingPool pool(counted);
  // Two 4 MiB segments; the first is freed and a 6 MiB request releases it to grow (the
  // peak is 8 MiB): its pages move into the new segment.
  void* a = pool.allocate(4 * kMiB);
  void* b = pool.allocate(4 * kMiB);
  std::memset(a, 0x61, 4 * kMiB);
  pool.free(a);
  void* c = pool.allocate(6 * kMiB);
  EXPECT_EQ(pages_holding(c, 4 * kMiB, 0x61), 4 * kMiB / kPage) << "a's pages moved into c";
  // The stream empties with two segments: its next allocation consolidates them into one
  // arena, made of their pages.
  std::memset(b, 0x62, 4 * kMiB);
  std::memset(c, 0x63, 6 * kMiB);
  pool.free(b);
  pool.free(c);
  void* d = pool.allocate(7 * kMiB);
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.consolidations, 1u);
  EXPECT_EQ(s.segments, 1u);
  EXPECT_EQ(pages_holding(d, 7 * kMiB, 0x62) + pages_holding(d, 7 * kMiB, 0x63), 7 * kMiB / kPage)
      << "the arena is made of the segments' pages";
  EXPECT_EQ(resident_pages(d, 7 * kMiB), 7 * kMiB / kPage);
  pool.free(d);
  pool.check_invariants();
  EXPECT_EQ(counted.stats().current_bytes, s.reserved_bytes);
}

}  // namespace
}  // namespace sdalloc
