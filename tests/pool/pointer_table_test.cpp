// Unit tests of PointerTable, the open-addressing map of live allocations (address -> Block).
//
// What the pool relies on: every inserted address is found until erased; erase answers
// whether the address was there; backward-shift deletion leaves every other entry findable
// (no tombstones), including probe runs that wrap past the table's last slot; and the table
// grows past its load factor without losing entries.
//
// Placing entries in chosen slots needs the table's hash: home_slot() mirrors
// PointerTable::slot_of(), and HomeSlotMirrorMatchesTheTable proves the mirror right through
// for_each()'s slot order, so a change of hash fails there first, with a clear name.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <random>
#include <unordered_map>
#include <vector>

#include "pool/block.hpp"
#include "pool/pointer_table.hpp"

namespace sdalloc::detail {
namespace {

constexpr std::size_t kUnit = 512;            // addresses are at least 512-byte aligned
constexpr std::size_t kInitialCapacity = 64;  // PointerTable::kInitialCapacity
constexpr std::size_t kLastSlot = kInitialCapacity - 1;

// Mirrors PointerTable::slot_of() for a table of `capacity` slots (a power of two).
std::size_t home_slot(std::uintptr_t addr, std::size_t capacity) {
  const unsigned shift = 64 - static_cast<unsigned>(__builtin_ctzll(capacity));
  return static_cast<std::size_t>(((addr >> 9) * 0x9E3779B97F4A7C15ULL) >> shift);
}

// The first `n` addresses (multiples of kUnit, from `from`) whose home in the initial table
// is `slot`.
std::vector<std::uintptr_t> addresses_at(std::size_t slot, std::size_t n,
                                         std::uintptr_t from = kUnit) {
  std::vector<std::uintptr_t> out;
  for (std::uintptr_t a = from; out.size() < n; a += kUnit) {
    if (home_slot(a, kInitialCapacity) == slot) out.push_back(a);
  }
  return out;
}

// A fake Block pointer per address: the table stores it and never dereferences it.
Block* tag(std::uintptr_t addr) { return reinterpret_cast<Block*>(addr + 8); }

void put(PointerTable& table, std::uintptr_t addr) {
  table.reserve_one();
  table.insert(addr, tag(addr));
}

// Addresses in the order for_each() visits them, i.e. slot order.
std::vector<std::uintptr_t> slot_order(const PointerTable& table) {
  std::vector<std::uintptr_t> out;
  table.for_each([&](std::uintptr_t addr, Block*) { out.push_back(addr); });
  return out;
}

// ---------------------------------------------------------------------------------------
// basics

TEST(PointerTable, EmptyTableFindsNothing) {
  PointerTable table;
  EXPECT_EQ(table.size(), 0u);
  EXPECT_EQ(table.find(kUnit), nullptr);
  EXPECT_FALSE(table.erase(kUnit));
  EXPECT_TRUE(slot_order(table).empty());
}

TEST(PointerTable, InsertedAddressIsFoundWithItsBlock) {
  PointerTable table;
  put(table, 7 * kUnit);
  EXPECT_EQ(table.size(), 1u);
  EXPECT_EQ(table.find(7 * kUnit), tag(7 * kUnit));
  EXPECT_EQ(table.find(8 * kUnit), nullptr);
  EXPECT_EQ(slot_order(table), std::vector<std::uintptr_t>{7 * kUnit});
}

TEST(PointerTable, RemovedAddressIsNotFound) {
  PointerTable table;
  put(table, 7 * kUnit);
  put(table, 9 * kUnit);
  EXPECT_TRUE(table.erase(7 * kUnit));
  EXPECT_EQ(table.find(7 * kUnit), nullptr);
  EXPECT_EQ(table.find(9 * kUnit), tag(9 * kUnit));
  EXPECT_EQ(table.size(), 1u);
}

TEST(PointerTable, EraseOfAnAbsentAddressAnswersFalseAndChangesNothing) {
  PointerTable table;
  put(table, 7 * kUnit);
  EXPECT_FALSE(table.erase(8 * kUnit));
  EXPECT_TRUE(table.erase(7 * kUnit));
  EXPECT_FALSE(table.erase(7 * kUnit)) << "second erase of the same address";
  EXPECT_EQ(table.size(), 0u);
}

TEST(PointerTable, EraseOfAnAbsentAddressSharingAHomeSlotAnswersFalse) {
  // The probe for an absent key walks a whole run of other keys before it stops.
  PointerTable table;
  const auto same_home = addresses_at(5, 4);
  for (std::size_t i = 0; i < 3; ++i) put(table, same_home[i]);
  EXPECT_EQ(table.find(same_home[3]), nullptr);
  EXPECT_FALSE(table.erase(same_home[3]));
  EXPECT_EQ(table.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(table.find(same_home[i]), tag(same_home[i]));
}

TEST(PointerTable, AddressZeroIsNeverPresent) {
  // Zero marks an empty slot, so it can be no allocation's address.
  PointerTable table;
  put(table, 7 * kUnit);
  EXPECT_EQ(table.find(0), nullptr);
  EXPECT_FALSE(table.erase(0));
  EXPECT_EQ(table.size(), 1u);
  EXPECT_EQ(table.find(7 * kUnit), tag(7 * kUnit));
}

TEST(PointerTable, HomeSlotMirrorMatchesTheTable) {
  // One address per home slot for half the slots (no collisions): each sits at its home, so
  // for_each's slot order must be the order of the mirrored homes.
  PointerTable table;
  std::map<std::size_t, std::uintptr_t> by_home;
  for (std::uintptr_t a = kUnit; by_home.size() < kInitialCapacity / 2; a += kUnit) {
    by_home.emplace(home_slot(a, kInitialCapacity), a);
  }
  std::vector<std::uintptr_t> expected;
  for (const auto& [home, addr] : by_home) {
    table.insert(addr, tag(addr));  // 32 of 64 slots: within the load factor, no growth
    expected.push_back(addr);
  }
  EXPECT_EQ(slot_order(table), expected)
      << "home_slot() no longer mirrors PointerTable::slot_of(); update it";
}

// ---------------------------------------------------------------------------------------
// backward-shift deletion

TEST(PointerTable, BackwardShiftKeepsChainsFindable) {
  // A run at slots 10..14: three keys from home 10, then two from home 11 pushed along.
  // Erasing each of the first three in turn must leave the other four findable.
  const auto home10 = addresses_at(10, 3);
  const auto home11 = addresses_at(11, 2);
  for (std::size_t victim = 0; victim < 3; ++victim) {
    PointerTable t;
    for (auto a : home10) put(t, a);
    for (auto a : home11) put(t, a);
    ASSERT_TRUE(t.erase(home10[victim]));
    for (std::size_t i = 0; i < 3; ++i) {
      if (i != victim) {
        EXPECT_EQ(t.find(home10[i]), tag(home10[i])) << "victim " << victim;
      }
    }
    for (auto a : home11) EXPECT_EQ(t.find(a), tag(a)) << "victim " << victim;
    EXPECT_EQ(t.size(), 4u);
  }
}

TEST(PointerTable, BackwardShiftLeavesEntriesAtTheirHomeInPlace) {
  // Run: A (home 20) at 20, B (home 20) at 21, C (home 22) at 22. Erasing A moves B into
  // slot 20 but must not move C, which sits at its home.
  PointerTable table;
  const auto home20 = addresses_at(20, 2);
  const auto home22 = addresses_at(22, 1);
  put(table, home20[0]);
  put(table, home20[1]);
  put(table, home22[0]);
  ASSERT_TRUE(table.erase(home20[0]));
  EXPECT_EQ(table.find(home20[1]), tag(home20[1]));
  EXPECT_EQ(table.find(home22[0]), tag(home22[0]));
  // A C wrongly moved into slot 21 would still be found; so check that slot 21 was left
  // empty: a new home-21 key must land there, before C.
  const auto home21 = addresses_at(21, 1);
  put(table, home21[0]);
  EXPECT_EQ(slot_order(table), (std::vector<std::uintptr_t>{home20[1], home21[0], home22[0]}));
}

TEST(PointerTable, ProbeRunsWrapAroundTheTableEnd) {
  // Three keys whose home is the last slot occupy slots 63, 0 and 1; a key whose home is 0
  // is pushed to slot 2.
  PointerTable table;
  const auto last = addresses_at(kLastSlot, 3);
  const auto first = addresses_at(0, 1);
  for (auto a : last) put(table, a);
  put(table, first[0]);
  EXPECT_EQ(slot_order(table), (std::vector<std::uintptr_t>{last[1], last[2], first[0], last[0]}));
  for (auto a : last) EXPECT_EQ(table.find(a), tag(a));
  EXPECT_EQ(table.find(first[0]), tag(first[0]));
}

TEST(PointerTable, BackwardShiftMovesEntriesBackAcrossTheTableEnd) {
  // Erasing the key in slot 63 pulls the wrapped keys back: slot 0's key to 63, slot 1's
  // to 0, and the home-0 key from slot 2 to slot 1.
  PointerTable table;
  const auto last = addresses_at(kLastSlot, 3);
  const auto first = addresses_at(0, 1);
  for (auto a : last) put(table, a);
  put(table, first[0]);
  ASSERT_TRUE(table.erase(last[0]));
  EXPECT_EQ(table.find(last[0]), nullptr);
  for (std::size_t i = 1; i < 3; ++i) EXPECT_EQ(table.find(last[i]), tag(last[i]));
  EXPECT_EQ(table.find(first[0]), tag(first[0]));
  EXPECT_EQ(slot_order(table), (std::vector<std::uintptr_t>{last[2], first[0], last[1]}));
  // And erasing from the wrapped part of the run, the other way round.
  ASSERT_TRUE(table.erase(last[2]));  // slot 0
  EXPECT_EQ(table.find(first[0]), tag(first[0]));
  EXPECT_EQ(table.find(last[1]), tag(last[1]));
  EXPECT_EQ(slot_order(table), (std::vector<std::uintptr_t>{first[0], last[1]}));
}

// ---------------------------------------------------------------------------------------
// growth

TEST(PointerTable, GrowsPastLoadFactor) {
  // Far more entries than the initial 64 slots: every growth must carry all entries over.
  PointerTable table;
  std::vector<std::uintptr_t> added;
  for (std::uintptr_t i = 1; i <= 1000; ++i) {
    const std::uintptr_t addr = i * 3 * kUnit;
    put(table, addr);
    added.push_back(addr);
    if (i == 32 || i == 33 || i == 64 || i == 65 || i == 1000) {  // around the doublings
      for (auto a : added) ASSERT_EQ(table.find(a), tag(a)) << "after " << i << " inserts";
    }
  }
  EXPECT_EQ(table.size(), 1000u);
  auto visited = slot_order(table);
  std::sort(visited.begin(), visited.end());
  EXPECT_EQ(visited, added);
}

TEST(PointerTable, GrowthSpreadsACrowdedHomeSlot) {
  // 40 keys sharing one home in the initial table: one run over half of it (wrapping past
  // the end), then growth re-homes them with more hash bits; every one stays findable.
  PointerTable table;
  const auto crowd = addresses_at(kLastSlot, 40);
  for (auto a : crowd) put(table, a);
  EXPECT_EQ(table.size(), crowd.size());
  for (auto a : crowd) EXPECT_EQ(table.find(a), tag(a));
  for (auto a : crowd) EXPECT_TRUE(table.erase(a));
  EXPECT_EQ(table.size(), 0u);
  EXPECT_TRUE(slot_order(table).empty());
}

TEST(PointerTable, EntriesCanBeReinsertedAfterErasingAll) {
  PointerTable table;
  for (int round = 0; round < 3; ++round) {
    for (std::uintptr_t i = 1; i <= 100; ++i) put(table, i * kUnit);
    EXPECT_EQ(table.size(), 100u);
    for (std::uintptr_t i = 1; i <= 100; ++i) ASSERT_TRUE(table.erase(i * kUnit));
    EXPECT_EQ(table.size(), 0u);
  }
}

// ---------------------------------------------------------------------------------------
// randomized, against std::unordered_map

TEST(PointerTable, RandomOperationsMatchAnUnorderedMap) {
  std::mt19937_64 rng(20261201);
  PointerTable table;
  std::unordered_map<std::uintptr_t, Block*> expected;
  // A small address space (256 addresses) so keys come back, runs collide and wrap; the
  // live count drifts up to ~200 and back, crossing two doublings.
  auto random_addr = [&] { return static_cast<std::uintptr_t>(1 + rng() % 256) * kUnit; };
  for (int step = 0; step < 20000; ++step) {
    const std::uintptr_t addr = random_addr();
    const bool grow_phase = (step / 2500) % 2 == 0;
    const auto op = static_cast<unsigned>(rng() % 10);
    if (op < (grow_phase ? 6u : 3u)) {  // insert if absent
      if (expected.count(addr) == 0) {
        Block* block = tag(addr + static_cast<std::uintptr_t>(step) * 16);
        table.reserve_one();
        table.insert(addr, block);
        expected.emplace(addr, block);
      }
    } else if (op < 8) {  // erase, present or not
      EXPECT_EQ(table.erase(addr), expected.erase(addr) == 1) << "erase " << addr;
    } else {  // find
      auto it = expected.find(addr);
      EXPECT_EQ(table.find(addr), it == expected.end() ? nullptr : it->second);
    }
    // Invariants: same size, same entries, and every entry reachable from its home slot.
    EXPECT_EQ(table.size(), expected.size());
    std::size_t visited = 0;
    table.for_each([&](std::uintptr_t a, Block* b) {
      ++visited;
      auto it = expected.find(a);
      ASSERT_NE(it, expected.end()) << "stray entry " << a;
      EXPECT_EQ(b, it->second);
    });
    EXPECT_EQ(visited, expected.size());
    for (const auto& [a, b] : expected) EXPECT_EQ(table.find(a), b) << "lost " << a;
    if (::testing::Test::HasFailure()) FAIL() << "first failure at step " << step;
  }
}

}  // namespace
}  // namespace sdalloc::detail
