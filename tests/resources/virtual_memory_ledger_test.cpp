// VirtualMemoryLedger: the range/chunk/mapping tables HostVirtualMemory and the CUDA
// driver's implementation share. Each question (which range holds an address, does a
// mapping overlap, is this the chunk made with that size) is checked at its edges, and the
// totals and the chunks' mapped marks follow every add and remove.
#include "resources/virtual_memory_ledger.hpp"

#include <gtest/gtest.h>

#include <cstdint>

namespace sdalloc::detail {
namespace {

constexpr std::uintptr_t kBase = 0x100000;

TEST(VirtualMemoryLedgerTest, RangesAreFoundByExactBaseAndSize) {
  VirtualMemoryLedger ledger;
  ledger.add_range(kBase, 0x4000);
  EXPECT_TRUE(ledger.is_range(kBase, 0x4000));
  EXPECT_FALSE(ledger.is_range(kBase, 0x2000));
  EXPECT_FALSE(ledger.is_range(kBase + 0x1000, 0x3000));
  EXPECT_EQ(ledger.reserved_bytes(), 0x4000u);
  ledger.remove_range(kBase);
  EXPECT_FALSE(ledger.is_range(kBase, 0x4000));
  EXPECT_EQ(ledger.reserved_bytes(), 0u);
}

TEST(VirtualMemoryLedgerTest, RangeHoldingAcceptsOnlyPlacesFullyInsideOneRange) {
  VirtualMemoryLedger ledger;
  ledger.add_range(kBase, 0x4000);
  ledger.add_range(kBase + 0x4000, 0x4000);  // adjacent, but a different range
  const auto end = ledger.ranges().end();
  EXPECT_EQ(ledger.range_holding(kBase, 0x4000)->first, kBase);
  EXPECT_EQ(ledger.range_holding(kBase + 0x3000, 0x1000)->first, kBase);
  EXPECT_EQ(ledger.range_holding(kBase + 0x4000, 0x1000)->first, kBase + 0x4000);
  EXPECT_EQ(ledger.range_holding(kBase + 0x3000, 0x2000), end);  // spans both ranges
  EXPECT_EQ(ledger.range_holding(kBase - 0x1000, 0x1000), end);  // below every range
  EXPECT_EQ(ledger.range_holding(kBase + 0x8000, 0x1000), end);  // just past the last
  EXPECT_EQ(ledger.range_holding(kBase, 0x4001), end);
}

TEST(VirtualMemoryLedgerTest, RangeHoldingInAnEmptyLedgerFindsNothing) {
  const VirtualMemoryLedger ledger;
  EXPECT_EQ(ledger.range_holding(kBase, 1), ledger.ranges().end());
}

TEST(VirtualMemoryLedgerTest, ChunksAreFoundByHandleAndSize) {
  VirtualMemoryLedger ledger;
  ledger.add_chunk(7, 0x2000);
  ASSERT_NE(ledger.find_chunk(7, 0x2000), nullptr);
  EXPECT_FALSE(ledger.find_chunk(7, 0x2000)->mapped);
  EXPECT_EQ(ledger.find_chunk(7, 0x1000), nullptr);  // another size
  EXPECT_EQ(ledger.find_chunk(8, 0x2000), nullptr);  // never made
  EXPECT_EQ(ledger.physical_bytes(), 0x2000u);
  ledger.remove_chunk(7);
  EXPECT_EQ(ledger.find_chunk(7, 0x2000), nullptr);
  EXPECT_EQ(ledger.physical_bytes(), 0u);
}

TEST(VirtualMemoryLedgerTest, MappingMarksItsChunkAndCountsItsBytes) {
  VirtualMemoryLedger ledger;
  ledger.add_range(kBase, 0x8000);
  ledger.add_chunk(1, 0x2000);
  ledger.add_mapping(kBase + 0x2000, 1, 0x2000);
  EXPECT_TRUE(ledger.find_chunk(1, 0x2000)->mapped);
  EXPECT_EQ(ledger.mapped_bytes(), 0x2000u);
  const VirtualMemoryLedger::Mapping* mapping = ledger.find_mapping(kBase + 0x2000, 0x2000);
  ASSERT_NE(mapping, nullptr);
  EXPECT_EQ(mapping->chunk, 1u);
  EXPECT_EQ(ledger.find_mapping(kBase + 0x2000, 0x1000), nullptr);  // another size
  EXPECT_EQ(ledger.find_mapping(kBase + 0x3000, 0x1000), nullptr);  // interior address

  ledger.remove_mapping(kBase + 0x2000);
  EXPECT_FALSE(ledger.find_chunk(1, 0x2000)->mapped);
  EXPECT_EQ(ledger.mapped_bytes(), 0u);
  EXPECT_TRUE(ledger.mappings().empty());
}

TEST(VirtualMemoryLedgerTest, OverlapIsDetectedOnEitherSideButNotForNeighbours) {
  VirtualMemoryLedger ledger;
  ledger.add_chunk(1, 0x2000);
  ledger.add_mapping(kBase + 0x2000, 1, 0x2000);                  // [0x2000, 0x4000)
  EXPECT_TRUE(ledger.overlaps_mapping(kBase + 0x2000, 0x2000));   // the same place
  EXPECT_TRUE(ledger.overlaps_mapping(kBase + 0x1000, 0x2000));   // runs into it
  EXPECT_TRUE(ledger.overlaps_mapping(kBase + 0x3000, 0x2000));   // starts inside it
  EXPECT_TRUE(ledger.overlaps_mapping(kBase, 0x8000));            // covers it
  EXPECT_FALSE(ledger.overlaps_mapping(kBase, 0x2000));           // ends where it starts
  EXPECT_FALSE(ledger.overlaps_mapping(kBase + 0x4000, 0x2000));  // starts where it ends
}

TEST(VirtualMemoryLedgerTest, RemovingWhatIsNotThereChangesNothing) {
  VirtualMemoryLedger ledger;
  ledger.add_range(kBase, 0x1000);
  ledger.add_chunk(1, 0x1000);
  ledger.add_mapping(kBase, 1, 0x1000);
  ledger.remove_range(kBase + 0x1000);
  ledger.remove_chunk(2);
  ledger.remove_mapping(kBase + 0x1000);
  EXPECT_EQ(ledger.reserved_bytes(), 0x1000u);
  EXPECT_EQ(ledger.physical_bytes(), 0x1000u);
  EXPECT_EQ(ledger.mapped_bytes(), 0x1000u);
  EXPECT_TRUE(ledger.find_chunk(1, 0x1000)->mapped);
}

TEST(VirtualMemoryLedgerTest, TotalsSumEveryEntry) {
  VirtualMemoryLedger ledger;
  ledger.add_range(kBase, 0x10000);
  ledger.add_range(kBase + 0x20000, 0x8000);
  ledger.add_chunk(1, 0x1000);
  ledger.add_chunk(2, 0x3000);
  ledger.add_mapping(kBase, 1, 0x1000);
  ledger.add_mapping(kBase + 0x20000, 2, 0x3000);
  EXPECT_EQ(ledger.reserved_bytes(), 0x18000u);
  EXPECT_EQ(ledger.physical_bytes(), 0x4000u);
  EXPECT_EQ(ledger.mapped_bytes(), 0x4000u);
  EXPECT_EQ(ledger.ranges().size(), 2u);
  EXPECT_EQ(ledger.chunks().size(), 2u);
  EXPECT_EQ(ledger.mappings().size(), 2u);
}

}  // namespace
}  // namespace sdalloc::detail
