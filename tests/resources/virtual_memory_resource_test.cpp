// VirtualMemoryResource over the host's memfd VirtualMemory: ranges that keep their contents
// while they grow in place, chunks handed from returned ranges to new ones instead of being
// freed and created again, every refusal leaving nothing behind; and a CachingPool over it
// growing its arena where, over whole segments only (as over cudaMalloc), it takes a second.
#include "sdalloc/resources/virtual_memory_resource.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/policies/caching_pool.hpp"
#include "sdalloc/resources/host_resource.hpp"
#include "sdalloc/resources/host_virtual_memory.hpp"
#include "sdalloc/resources/segments_only_resource.hpp"
#include "support/arena_after_churn.hpp"
#include "support/mapped_pages.hpp"

namespace sdalloc {
namespace {

using test::bytes_of;
using test::pages_holding;

constexpr std::size_t kPage = 4096;
constexpr std::size_t kMiB = std::size_t{1} << 20;

// Nothing handed out is left: no range, no chunk, no mapping, no reservation.
::testing::AssertionResult all_returned(const VirtualMemoryResource& ranges,
                                        const HostVirtualMemory& memory) {
  if (ranges.ranges() == 0 && memory.physical_bytes() == 0 && memory.mapped_bytes() == 0 &&
      memory.reserved_bytes() == 0) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << ranges.ranges() << " ranges, " << memory.physical_bytes() << " B physical, "
         << memory.mapped_bytes() << " B mapped, " << memory.reserved_bytes() << " B reserved";
}

TEST(VirtualMemoryResource, RangesAreRoundedToTheGranularityAndGiveEverythingBack) {
  HostVirtualMemory memory;
  VirtualMemoryResource ranges(memory);
  EXPECT_EQ(ranges.name(), "vm-ranges(" + memory.name() + ")");
  EXPECT_EQ(ranges.page_size(), kPage);
  EXPECT_TRUE(ranges.can_grow());
  EXPECT_TRUE(ranges.can_coalesce());
  EXPECT_EQ(ranges.allocate(0), nullptr);
  ranges.deallocate(nullptr, 0);
  void* a = ranges.allocate(10000);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a) % kPage, 0u);
  std::memset(a, 0x11, 3 * kPage);  // the rounding is usable memory
  EXPECT_EQ(ranges.mapped_bytes(), 3 * kPage);
  EXPECT_EQ(memory.physical_bytes(), 3 * kPage);
  EXPECT_EQ(memory.reserved_bytes(), 6 * kPage) << "as much room again behind the range";
  ranges.deallocate(a, 10000);
  EXPECT_TRUE(all_returned(ranges, memory));
}

TEST(VirtualMemoryResource, GrowKeepsTheContentsAndTakesTheDonorsChunksFirst) {
  HostVirtualMemory memory;
  VirtualMemoryResource ranges(memory);
  void* a = ranges.allocate(4 * kMiB);
  void* donor = ranges.allocate(kMiB);
  std::memset(a, 0x51, 4 * kMiB);
  const ResourceRange donors[] = {{donor, kMiB}};
  ASSERT_TRUE(ranges.grow(a, 4 * kMiB, 6 * kMiB, donors));
  EXPECT_EQ(pages_holding(a, 4 * kMiB, 0x51), 4 * kMiB / kPage) << "the range kept its bytes";
  std::memset(bytes_of(a) + 4 * kMiB, 0x52, 2 * kMiB);  // the new part is memory
  EXPECT_EQ(ranges.ranges(), 1u) << "the donor was returned";
  EXPECT_EQ(ranges.mapped_bytes(), 6 * kMiB);
  EXPECT_EQ(memory.physical_bytes(), 6 * kMiB) << "the donor's chunk and 1 MiB fresh";
  EXPECT_THROW(ranges.deallocate(donor, kMiB), InvalidPointer) << "a donor is gone";
  // Within the rounding, nothing to map; beyond the room (8 MiB), refused and unchanged.
  EXPECT_TRUE(ranges.grow(a, 6 * kMiB - 100, 6 * kMiB, {}));
  EXPECT_EQ(ranges.mapped_bytes(), 6 * kMiB);
  void* kept = ranges.allocate(kMiB);
  const ResourceRange kept_donor[] = {{kept, kMiB}};
  EXPECT_FALSE(ranges.grow(a, 6 * kMiB, 8 * kMiB + 1, kept_donor));
  EXPECT_EQ(ranges.ranges(), 2u) << "a refused grow leaves the donors the caller's";
  EXPECT_EQ(ranges.mapped_bytes(), 7 * kMiB);
  ASSERT_TRUE(ranges.grow(a, 6 * kMiB, 8 * kMiB, kept_donor));
  EXPECT_EQ(pages_holding(a, 4 * kMiB, 0x51), 4 * kMiB / kPage);
  EXPECT_EQ(pages_holding(bytes_of(a) + 4 * kMiB, 2 * kMiB, 0x52), 2 * kMiB / kPage);
  ranges.deallocate(a, 8 * kMiB);
  EXPECT_TRUE(all_returned(ranges, memory));
}

TEST(VirtualMemoryResource, CoalesceMapsTheReturnedChunksIntoTheNewRange) {
  HostVirtualMemoryOptions options;
  options.physical_limit = 8 * kMiB;  // no room for old and new at once
  HostVirtualMemory memory(options);
  VirtualMemoryResource ranges(memory);
  EXPECT_EQ(ranges.capacity(), 8 * kMiB);
  void* a = ranges.allocate(3 * kMiB);
  void* b = ranges.allocate(3 * kMiB);
  void* c = ranges.allocate(2 * kMiB);
  std::memset(a, 0x0a, 3 * kMiB);
  std::memset(b, 0x0b, 3 * kMiB);
  // Chunks of 2 MiB: a and b are 2 + 1 MiB each. Into 4.5 MiB go a's two and b's 1 MiB
  // chunk; b's 2 MiB one does not fit and is destroyed before the last 0.5 MiB is created
  // (created first, it would pass the 8 MiB limit).
  const ResourceRange returned[] = {{a, 3 * kMiB}, {b, 3 * kMiB}};
  void* whole = ranges.coalesce(returned, 4 * kMiB + kMiB / 2);
  ASSERT_NE(whole, nullptr);
  EXPECT_EQ(pages_holding(whole, 3 * kMiB, 0x0a), 3 * kMiB / kPage)
      << "the first returned range's chunks, with their pages, are the new range's start";
  EXPECT_EQ(pages_holding(bytes_of(whole) + 3 * kMiB, kMiB, 0x0b), kMiB / kPage);
  std::memset(bytes_of(whole) + 4 * kMiB, 0x0c, kMiB / 2);
  EXPECT_EQ(memory.physical_bytes(), 6 * kMiB + kMiB / 2) << "4.5 MiB and c's 2";
  EXPECT_EQ(ranges.ranges(), 2u);
  const ResourceRange both[] = {{whole, 4 * kMiB + kMiB / 2}, {c, 2 * kMiB}};
  EXPECT_EQ(ranges.coalesce(both, 0), nullptr) << "zero bytes: everything returned";
  EXPECT_TRUE(all_returned(ranges, memory));
}

TEST(VirtualMemoryResource, SplitCutsWhereChunksMeetAndTheReservationGoesWithTheLastPart) {
  HostVirtualMemory memory;
  VirtualMemoryResource ranges(memory);
  void* a = ranges.allocate(6 * kMiB);  // chunks of 2 MiB
  std::memset(a, 0x61, 6 * kMiB);
  EXPECT_FALSE(ranges.split(a, 6 * kMiB, 3 * kMiB)) << "inside a chunk: refused";
  EXPECT_FALSE(ranges.split(a, 6 * kMiB, 6 * kMiB));
  ASSERT_TRUE(ranges.split(a, 6 * kMiB, 4 * kMiB));
  void* second = bytes_of(a) + 4 * kMiB;
  EXPECT_EQ(ranges.ranges(), 2u);
  EXPECT_FALSE(ranges.grow(a, 4 * kMiB, 5 * kMiB, {})) << "the second part lies behind it";
  ASSERT_TRUE(ranges.grow(second, 2 * kMiB, 5 * kMiB, {})) << "the room behind is the second's";
  EXPECT_EQ(pages_holding(second, 2 * kMiB, 0x61), 2 * kMiB / kPage);
  ranges.deallocate(a, 4 * kMiB);
  EXPECT_EQ(memory.reserved_bytes(), 12 * kMiB) << "the second part still lies in it";
  EXPECT_EQ(pages_holding(second, 2 * kMiB, 0x61), 2 * kMiB / kPage);
  ranges.deallocate(second, 5 * kMiB);
  EXPECT_TRUE(all_returned(ranges, memory));
}

TEST(VirtualMemoryResource, ForeignRepeatedAndFreedPointersAreRefusedBeforeAnythingChanges) {
  HostVirtualMemory memory;
  VirtualMemoryResource ranges(memory);
  void* a = ranges.allocate(kMiB);
  int local = 0;
  EXPECT_THROW(ranges.deallocate(&local, sizeof(local)), InvalidPointer);
  const ResourceRange with_foreign[] = {{a, kMiB}, {&local, 4}};
  EXPECT_THROW(ranges.coalesce(with_foreign, 2 * kMiB), InvalidPointer);
  const ResourceRange twice[] = {{a, kMiB}, {a, kMiB}};
  EXPECT_THROW(ranges.coalesce(twice, 2 * kMiB), InvalidPointer);
  EXPECT_THROW(ranges.grow(&local, 4, 8, {}), InvalidPointer);
  const ResourceRange itself[] = {{a, kMiB}};
  EXPECT_THROW(ranges.grow(a, kMiB, 2 * kMiB, itself), InvalidArgument);
  EXPECT_EQ(ranges.ranges(), 1u) << "a is still handed out, untouched";
  EXPECT_EQ(memory.physical_bytes(), kMiB);
  std::memset(a, 1, kMiB);
  ranges.deallocate(a, kMiB);
  EXPECT_THROW(ranges.deallocate(a, kMiB), InvalidPointer) << "double free";
  EXPECT_EQ(memory.physical_bytes(), 0u);
}

TEST(VirtualMemoryResource, ExhaustedMemoryLeavesNothingBehind) {
  HostVirtualMemoryOptions options;
  options.physical_limit = 6 * kMiB;
  HostVirtualMemory memory(options);
  VirtualMemoryResource ranges(memory);
  EXPECT_THROW(ranges.allocate(std::numeric_limits<std::size_t>::max() - 10), OutOfMemory);
  try {
    ranges.allocate(7 * kMiB);
    ADD_FAILURE() << "7 MiB from a 6 MiB memory";
  } catch (const OutOfMemory& e) {
    EXPECT_EQ(e.info.requested, 7 * kMiB);
    EXPECT_NE(std::string(e.what()).find("more than the memory can ever hold"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(ranges.ranges(), 0u);
  EXPECT_EQ(memory.reserved_bytes(), 0u);
  void* other = ranges.allocate(2 * kMiB);
  EXPECT_THROW(ranges.allocate(5 * kMiB), OutOfMemory) << "the memory has 4 MiB left";
  EXPECT_EQ(memory.reserved_bytes(), 4 * kMiB) << "the refused range's reservation went back";
  void* a = ranges.allocate(3 * kMiB);
  void* donor = ranges.allocate(kMiB);
  std::memset(a, 0x33, 3 * kMiB);
  const ResourceRange donors[] = {{donor, kMiB}};
  // The donor's chunk maps behind a, then the last 1 MiB cannot be created: undone.
  EXPECT_THROW(ranges.grow(a, 3 * kMiB, 5 * kMiB, donors), OutOfMemory);
  EXPECT_EQ(ranges.ranges(), 2u) << "the donor was returned all the same";
  EXPECT_EQ(ranges.mapped_bytes(), 5 * kMiB) << "a kept its size";
  EXPECT_EQ(memory.physical_bytes(), 5 * kMiB);
  EXPECT_EQ(memory.mapped_bytes(), 5 * kMiB);
  EXPECT_EQ(pages_holding(a, 3 * kMiB, 0x33), 3 * kMiB / kPage);
  ASSERT_TRUE(ranges.grow(a, 3 * kMiB, 4 * kMiB, {})) << "what fits still grows";
  const ResourceRange all[] = {{a, 4 * kMiB}};
  EXPECT_THROW(ranges.coalesce(all, 6 * kMiB), OutOfMemory);
  EXPECT_EQ(ranges.ranges(), 1u) << "coalesce returns its ranges even when refused";
  EXPECT_EQ(memory.physical_bytes(), 2 * kMiB);
  EXPECT_EQ(memory.reserved_bytes(), 4 * kMiB);
  ranges.deallocate(other, 2 * kMiB);
  EXPECT_TRUE(all_returned(ranges, memory));
}

TEST(VirtualMemoryResource, ConcurrentThreadsEachGetTheirOwnMemory) {
  HostVirtualMemory memory;
  VirtualMemoryResource ranges(memory);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&ranges, t] {
      for (int i = 0; i < 50; ++i) {
        const std::size_t bytes = static_cast<std::size_t>(1 + (i + t) % 5) * 16 * kPage;
        void* p = ranges.allocate(bytes);
        std::memset(p, t + 1, bytes);
        void* q = ranges.allocate(bytes);
        const ResourceRange donor[] = {{q, bytes}};
        ASSERT_TRUE(ranges.grow(p, bytes, 2 * bytes, donor));
        std::memset(bytes_of(p) + bytes, t + 1, bytes);
        EXPECT_EQ(pages_holding(p, 2 * bytes, static_cast<unsigned char>(t + 1)),
                  2 * bytes / kPage);
        ranges.deallocate(p, 2 * bytes);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_TRUE(all_returned(ranges, memory));
}

// The arena of support/arena_after_churn.hpp (12 MiB, 1 MiB live at its start): a 16 MiB
// request grows it over VirtualMemoryResource, and takes a second segment beside it over
// whole segments only, as a pool over cudaMalloc does.
TEST(VirtualMemoryResource, APoolOverItGrowsItsArenaWhereSegmentsOnlyTakeASecond) {
  const auto after_shape_change = [](MemoryResource& upstream) {
    CachingPool pool(upstream, test::arena_test_options());
    void* low = test::churn_into_arena(pool);
    void* big = pool.allocate(16 * kMiB);
    std::memset(big, 0x7f, 16 * kMiB);
    const PoolStats stats = pool.stats();
    pool.check_invariants();
    pool.free(big);
    pool.free(low);
    return stats;
  };
  HostVirtualMemory memory;
  VirtualMemoryResource ranges(memory);
  const PoolStats grown = after_shape_change(ranges);
  EXPECT_EQ(grown.consolidations, 1u);
  EXPECT_EQ(grown.arena_growths, 1u);
  EXPECT_EQ(grown.segments, 1u);
  EXPECT_EQ(grown.reserved_bytes, 17 * kMiB) << "12 MiB arena grown by what its tail lacked";
  HostResource host;
  SegmentsOnlyResource segments_only(host);
  const PoolStats beside = after_shape_change(segments_only);
  EXPECT_EQ(beside.arena_growths, 0u);
  EXPECT_EQ(beside.segments, 2u);
  EXPECT_GT(beside.reserved_bytes, grown.reserved_bytes + 8 * kMiB);
  EXPECT_EQ(memory.physical_bytes(), 0u) << "the pool gave everything back";
}

}  // namespace
}  // namespace sdalloc
