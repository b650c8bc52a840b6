// The drop-in's RangeResource: segments carved from one reserved range, first fit by
// address, committed on allocation (fresh zero pages), protected and given back on
// deallocation, the bytes held capped by the capacity.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>

#include "preload/address_range.hpp"
#include "sdalloc/core/errors.hpp"
#include "support/mapped_pages.hpp"

namespace sdalloc::preload {
namespace {

constexpr std::size_t kPage = 4096;
constexpr std::size_t kMiB = std::size_t{1} << 20;

using test::bytes_of;
using test::pages_holding;

struct Range {
  Range() { EXPECT_TRUE(reserved.reserve(std::size_t{1} << 30)); }  // the least it takes
  ReservedRange reserved;
};

TEST(RangeResource, CarvesFreshPagesFirstFitByAddressAndTakesThemBack) {
  Range range;
  RangeResource resource(range.reserved, 0);
  void* a = resource.allocate(4 * kMiB);
  void* b = resource.allocate(kMiB);
  EXPECT_TRUE(range.reserved.contains(a));
  EXPECT_EQ(bytes_of(b), bytes_of(a) + 4 * kMiB) << "the lowest free place";
  EXPECT_EQ(pages_holding(a, 4 * kMiB, 0), 4 * kMiB / kPage) << "fresh pages are zero";
  std::memset(a, 0x21, 4 * kMiB);  // committed, writable
  EXPECT_EQ(resource.held(), 5 * kMiB);
  resource.deallocate(a, 4 * kMiB);
  EXPECT_EQ(range.reserved.carved_bytes(), kMiB) << "a's place went back to the range";
  void* c = resource.allocate(2 * kMiB);
  EXPECT_EQ(c, a) << "and is carved again first";
  EXPECT_EQ(pages_holding(c, 2 * kMiB, 0), 2 * kMiB / kPage) << "with fresh pages";
  resource.deallocate(c, 2 * kMiB);
  resource.deallocate(b, kMiB);
  EXPECT_EQ(resource.held(), 0u);
  EXPECT_EQ(range.reserved.carved_bytes(), 0u);
}

TEST(RangeResource, ACapacityRefusesWhatWouldPassItAndChangesNothing) {
  Range range;
  RangeResource resource(range.reserved, 5 * kMiB);
  void* a = resource.allocate(4 * kMiB);
  EXPECT_THROW((void)resource.allocate(2 * kMiB), OutOfMemory);
  EXPECT_EQ(resource.held(), 4 * kMiB);
  EXPECT_EQ(range.reserved.carved_bytes(), 4 * kMiB);
  void* b = resource.allocate(kMiB);  // exactly at the capacity
  resource.deallocate(b, kMiB);
  resource.deallocate(a, 4 * kMiB);
  EXPECT_EQ(resource.held(), 0u);
}

TEST(RangeResource, FreshPagesAreNotedForCalloc) {
  Range range;
  RangeResource resource(range.reserved, 0);
  FreshPages& fresh = FreshPages::of_this_thread();
  fresh.clear();
  void* a = resource.allocate(3 * kPage);
  EXPECT_EQ(fresh.begin, reinterpret_cast<std::uintptr_t>(a));
  EXPECT_EQ(fresh.end, reinterpret_cast<std::uintptr_t>(a) + 3 * kPage);
  resource.deallocate(a, 3 * kPage);
  fresh.clear();
}

}  // namespace
}  // namespace sdalloc::preload
