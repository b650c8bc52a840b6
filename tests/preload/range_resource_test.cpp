// The drop-in's RangeResource: segments carved from one reserved range, grown in place where
// the range's next addresses are free (arena growth, docs/caching_pool.md), with the donors'
// pages moved in and the capacity counting the net change.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstddef>
#include <cstring>

#include "preload/address_range.hpp"
#include "support/mapped_pages.hpp"

namespace sdalloc::preload {
namespace {

constexpr std::size_t kPage = 4096;
constexpr std::size_t kMiB = std::size_t{1} << 20;

using test::bytes_of;
using test::is_unmapped;
using test::pages_holding;

struct Range {
  Range() { EXPECT_TRUE(reserved.reserve(std::size_t{1} << 30)); }  // the least it takes
  ReservedRange reserved;
};

TEST(RangeResourceGrow, GrowsWhereTheNextAddressesAreFreeAndNowhereElse) {
  Range range;
  RangeResource resource(range.reserved, 0);
  ASSERT_TRUE(resource.can_grow());
  void* a = resource.allocate(4 * kMiB);
  std::memset(a, 0x21, 4 * kMiB);
  ASSERT_TRUE(resource.grow(a, 4 * kMiB, 6 * kMiB, {}));
  EXPECT_EQ(pages_holding(a, 4 * kMiB, 0x21), 4 * kMiB / kPage);
  EXPECT_EQ(pages_holding(bytes_of(a) + 4 * kMiB, 2 * kMiB, 0), 2 * kMiB / kPage);
  std::memset(bytes_of(a) + 4 * kMiB, 0x22, 2 * kMiB);  // committed, writable
  EXPECT_EQ(resource.held(), 6 * kMiB);
  EXPECT_EQ(range.reserved.carved_bytes(), 6 * kMiB);
  // The next piece is carved right behind it (first fit by address): no room to grow now.
  void* b = resource.allocate(kMiB);
  EXPECT_EQ(bytes_of(b), bytes_of(a) + 6 * kMiB);
  EXPECT_FALSE(resource.grow(a, 6 * kMiB, 8 * kMiB, {}));
  EXPECT_EQ(resource.held(), 7 * kMiB) << "refused: nothing changed";
  EXPECT_EQ(range.reserved.carved_bytes(), 7 * kMiB);
  resource.deallocate(b, kMiB);
  resource.deallocate(a, 6 * kMiB);
  EXPECT_EQ(resource.held(), 0u);
  EXPECT_EQ(range.reserved.carved_bytes(), 0u);
}

TEST(RangeResourceGrow, TheDonorsPagesMoveInAndTheCapacityCountsTheNetChange) {
  Range range;
  RangeResource resource(range.reserved, 10 * kMiB);
  void* donor = resource.allocate(3 * kMiB);  // carved first: lower addresses
  void* a = resource.allocate(4 * kMiB);
  std::memset(donor, 0x31, 3 * kMiB);
  const ResourceRange donors[] = {{donor, 3 * kMiB}};
  EXPECT_FALSE(resource.grow(a, 4 * kMiB, 15 * kMiB, donors)) << "past the capacity";
  EXPECT_EQ(pages_holding(donor, 3 * kMiB, 0x31), 3 * kMiB / kPage) << "still the caller's";
  ASSERT_TRUE(resource.grow(a, 4 * kMiB, 9 * kMiB, donors)) << "4 + 5 - 3 + 3 fits in 10";
  EXPECT_EQ(pages_holding(bytes_of(a) + 4 * kMiB, 3 * kMiB, 0x31), 3 * kMiB / kPage) << "moved";
  EXPECT_EQ(pages_holding(bytes_of(a) + 7 * kMiB, 2 * kMiB, 0), 2 * kMiB / kPage) << "fresh";
  EXPECT_EQ(resource.held(), 9 * kMiB);
  EXPECT_EQ(range.reserved.carved_bytes(), 9 * kMiB) << "the donor's place went back";
  resource.deallocate(a, 9 * kMiB);
  EXPECT_EQ(resource.held(), 0u);
}

// A coalesce or a grow moves the donors' pages out of their places, which must stay mapped
// until they are reserved space again: a moment's hole there is where another thread's
// mmap(NULL) lands (a new thread's stack, in the drop-in's stress test), and the protect()
// that follows maps over it (segfaults, 2026-12-04: a plain mremap unmapped the source).
TEST(RangeResourceMoves, TheSourceStaysMappedAndThePagesArrive) {
  void* area =
      ::mmap(nullptr, 16 * kMiB, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ASSERT_NE(area, MAP_FAILED);
  const auto base = reinterpret_cast<std::uintptr_t>(area);
  // Two kernel mappings side by side (a source made of two moves in halves: EFAULT).
  ASSERT_TRUE(ReservedRange::commit(area, 2 * kMiB));
  ASSERT_TRUE(ReservedRange::commit(bytes_of(area) + 2 * kMiB, 2 * kMiB));
  ASSERT_EQ(::mprotect(bytes_of(area) + 2 * kMiB, 2 * kMiB, PROT_READ), 0);  // another VMA
  std::memset(area, 0x51, 2 * kMiB);
  ASSERT_EQ(::mprotect(bytes_of(area) + 2 * kMiB, 2 * kMiB, PROT_READ | PROT_WRITE), 0);
  std::memset(bytes_of(area) + 2 * kMiB, 0x52, 2 * kMiB);
  ASSERT_TRUE(move_pages_keeping_place(base, base + 8 * kMiB, 4 * kMiB));
  EXPECT_FALSE(is_unmapped(area, 4 * kMiB)) << "the source's place was left a hole";
  EXPECT_EQ(pages_holding(bytes_of(area) + 8 * kMiB, 2 * kMiB, 0x51), 2 * kMiB / kPage);
  EXPECT_EQ(pages_holding(bytes_of(area) + 10 * kMiB, 2 * kMiB, 0x52), 2 * kMiB / kPage);
  ::munmap(area, 16 * kMiB);
}

TEST(RangeResourceMoves, ACoalescedDonorsPlaceIsReservedSpaceAtOnce) {
  Range range;
  RangeResource resource(range.reserved, 0);
  void* a = resource.allocate(2 * kMiB);
  void* b = resource.allocate(2 * kMiB);
  std::memset(a, 0x61, 2 * kMiB);
  std::memset(b, 0x62, 2 * kMiB);
  const ResourceRange donors[] = {{a, 2 * kMiB}, {b, 2 * kMiB}};
  void* joined = resource.coalesce(donors, 6 * kMiB);
  EXPECT_EQ(pages_holding(joined, 2 * kMiB, 0x61), 2 * kMiB / kPage);
  EXPECT_EQ(pages_holding(bytes_of(joined) + 2 * kMiB, 2 * kMiB, 0x62), 2 * kMiB / kPage);
  // The donors' places are back in the range, mapped (PROT_NONE), never unmapped.
  if (joined != a) {
    EXPECT_FALSE(is_unmapped(a, 2 * kMiB));
  }
  EXPECT_EQ(resource.held(), 6 * kMiB);
  resource.deallocate(joined, 6 * kMiB);
  EXPECT_EQ(resource.held(), 0u);
}

}  // namespace
}  // namespace sdalloc::preload
