// Unit tests of QuickLists, the per-size stacks of freed blocks parked unmerged.
//
// What the pool relies on: pop(size) hands back a block parked with exactly that size (the
// last one parked) or nothing; push() refuses, and leaves the block alone, when the block's
// slot holds another size or kMaxBlocks blocks are parked; drain() hands every parked block
// to the caller exactly once and leaves the lists empty; count() and bytes() say what is
// parked. Which sizes share a slot is found by behaviour (sizes_sharing_a_slot()), so the
// tests do not depend on the slot hash.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "pool/block.hpp"
#include "pool/quick_lists.hpp"

namespace sdalloc::detail {
namespace {

constexpr std::size_t kUnit = 512;  // pool block sizes are multiples of 512

class Blocks {
 public:
  Block* make(std::size_t size) {
    Block& b = records_.emplace_back();
    b.size = size;
    b.addr = (records_.size() + 1) * 1024 * kUnit;
    return &b;
  }

 private:
  std::deque<Block> records_;  // stable addresses
};

// Two different sizes that map to the same slot, found by pushing.
std::pair<std::size_t, std::size_t> sizes_sharing_a_slot() {
  QuickLists lists;
  Blocks blocks;
  const std::size_t first = kUnit;
  EXPECT_TRUE(lists.push(blocks.make(first)));
  for (std::size_t size = 2 * kUnit; size < 100000 * kUnit; size += kUnit) {
    Block* b = blocks.make(size);
    if (!lists.push(b)) return {first, size};
    lists.pop(size);
  }
  ADD_FAILURE() << "no two sizes share a slot";
  return {first, first};
}

// A size whose slot differs from `size`'s.
std::size_t size_in_another_slot(std::size_t size) {
  QuickLists lists;
  Blocks blocks;
  EXPECT_TRUE(lists.push(blocks.make(size)));
  for (std::size_t other = size + kUnit;; other += kUnit) {
    if (lists.push(blocks.make(other))) return other;
  }
}

std::vector<Block*> drain_all(QuickLists& lists) {
  std::vector<Block*> out;
  lists.drain([&](Block* b) { out.push_back(b); });
  return out;
}

// ---------------------------------------------------------------------------------------
// push and pop

TEST(QuickLists, EmptyListsGiveNothing) {
  QuickLists lists;
  EXPECT_EQ(lists.pop(kUnit), nullptr);
  EXPECT_EQ(lists.pop(0), nullptr);
  EXPECT_EQ(lists.count(), 0u);
  EXPECT_EQ(lists.bytes(), 0u);
  EXPECT_TRUE(drain_all(lists).empty());
}

TEST(QuickLists, ParkedBlockIsHandedBackForItsExactSize) {
  QuickLists lists;
  Blocks blocks;
  Block* b = blocks.make(4 * kUnit);
  ASSERT_TRUE(lists.push(b));
  EXPECT_TRUE(b->cached);
  EXPECT_EQ(lists.count(), 1u);
  EXPECT_EQ(lists.bytes(), 4 * kUnit);
  EXPECT_EQ(lists.pop(3 * kUnit), nullptr) << "no best fit here: sizes must match exactly";
  EXPECT_EQ(lists.pop(5 * kUnit), nullptr);
  EXPECT_EQ(lists.pop(4 * kUnit), b);
  EXPECT_FALSE(b->cached);
  EXPECT_EQ(b->next_cached, nullptr);
  EXPECT_EQ(lists.count(), 0u);
  EXPECT_EQ(lists.bytes(), 0u);
  EXPECT_EQ(lists.pop(4 * kUnit), nullptr);
}

TEST(QuickLists, PopReturnsTheLastBlockParked) {
  // Last in, first out: the most recently freed block is the likeliest to be warm in cache.
  QuickLists lists;
  Blocks blocks;
  Block* a = blocks.make(2 * kUnit);
  Block* b = blocks.make(2 * kUnit);
  Block* c = blocks.make(2 * kUnit);
  for (Block* x : {a, b, c}) ASSERT_TRUE(lists.push(x));
  EXPECT_EQ(lists.count(), 3u);
  EXPECT_EQ(lists.bytes(), 6 * kUnit);
  EXPECT_EQ(lists.pop(2 * kUnit), c);
  EXPECT_EQ(lists.pop(2 * kUnit), b);
  EXPECT_EQ(lists.pop(2 * kUnit), a);
  EXPECT_EQ(lists.pop(2 * kUnit), nullptr);
}

TEST(QuickLists, SizesInDifferentSlotsAreKeptApart) {
  QuickLists lists;
  Blocks blocks;
  const std::size_t s1 = kUnit;
  const std::size_t s2 = size_in_another_slot(s1);
  Block* a = blocks.make(s1);
  Block* b = blocks.make(s2);
  ASSERT_TRUE(lists.push(a));
  ASSERT_TRUE(lists.push(b));
  EXPECT_EQ(lists.bytes(), s1 + s2);
  EXPECT_EQ(lists.pop(s2), b);
  EXPECT_EQ(lists.pop(s2), nullptr);
  EXPECT_EQ(lists.pop(s1), a);
}

// ---------------------------------------------------------------------------------------
// refusals

TEST(QuickLists, SizeWhoseSlotHoldsAnotherSizeIsRefused) {
  const auto [held, refused] = sizes_sharing_a_slot();
  ASSERT_NE(held, refused);
  QuickLists lists;
  Blocks blocks;
  Block* a = blocks.make(held);
  Block* b = blocks.make(refused);
  ASSERT_TRUE(lists.push(a));
  EXPECT_FALSE(lists.push(b));
  EXPECT_FALSE(b->cached) << "a refused block is left alone";
  EXPECT_EQ(b->next_cached, nullptr);
  EXPECT_EQ(lists.count(), 1u);
  EXPECT_EQ(lists.bytes(), held);
  EXPECT_EQ(lists.pop(refused), nullptr) << "the slot's blocks are of another size";
  EXPECT_EQ(lists.pop(held), a);
}

TEST(QuickLists, SlotIsFreedWhenItsListEmpties) {
  const auto [first, second] = sizes_sharing_a_slot();
  QuickLists lists;
  Blocks blocks;
  Block* a = blocks.make(first);
  Block* b = blocks.make(second);
  ASSERT_TRUE(lists.push(a));
  ASSERT_EQ(lists.pop(first), a);
  EXPECT_TRUE(lists.push(b)) << "the emptied slot may take another size";
  EXPECT_EQ(lists.pop(first), nullptr);
  EXPECT_EQ(lists.pop(second), b);
}

TEST(QuickLists, ParksAtMostMaxBlocks) {
  QuickLists lists;
  Blocks blocks;
  const std::size_t size = 3 * kUnit;
  for (std::size_t i = 0; i < QuickLists::kMaxBlocks; ++i) {
    ASSERT_TRUE(lists.push(blocks.make(size))) << "block " << i;
  }
  EXPECT_EQ(lists.count(), QuickLists::kMaxBlocks);
  Block* same = blocks.make(size);
  Block* other = blocks.make(size_in_another_slot(size));
  EXPECT_FALSE(lists.push(same));
  EXPECT_FALSE(lists.push(other)) << "the limit is on all lists together";
  EXPECT_FALSE(same->cached);
  EXPECT_FALSE(other->cached);
  EXPECT_EQ(lists.count(), QuickLists::kMaxBlocks);
  EXPECT_EQ(lists.bytes(), QuickLists::kMaxBlocks * size);
  ASSERT_NE(lists.pop(size), nullptr);
  EXPECT_TRUE(lists.push(other)) << "room again after a pop";
}

// ---------------------------------------------------------------------------------------
// drain

TEST(QuickLists, DrainHandsEveryParkedBlockToReleaseOnce) {
  QuickLists lists;
  Blocks blocks;
  const std::size_t s1 = 2 * kUnit;
  const std::size_t s2 = size_in_another_slot(s1);
  std::set<Block*> parked;
  for (int i = 0; i < 5; ++i) {
    for (std::size_t s : {s1, s2}) {
      Block* b = blocks.make(s);
      ASSERT_TRUE(lists.push(b));
      parked.insert(b);
    }
  }
  std::vector<Block*> released;
  lists.drain([&](Block* b) {
    EXPECT_FALSE(b->cached) << "released blocks are no longer parked";
    EXPECT_EQ(b->next_cached, nullptr);
    released.push_back(b);
  });
  EXPECT_EQ(released.size(), parked.size());
  EXPECT_EQ(std::set<Block*>(released.begin(), released.end()), parked);
  EXPECT_EQ(lists.count(), 0u);
  EXPECT_EQ(lists.bytes(), 0u);
  EXPECT_EQ(lists.pop(s1), nullptr);
  EXPECT_EQ(lists.pop(s2), nullptr);
  EXPECT_TRUE(drain_all(lists).empty()) << "a second drain releases nothing";
  EXPECT_TRUE(lists.push(blocks.make(s1))) << "lists are usable after a drain";
}

TEST(QuickLists, DrainFreesSlotsForOtherSizes) {
  const auto [first, second] = sizes_sharing_a_slot();
  QuickLists lists;
  Blocks blocks;
  ASSERT_TRUE(lists.push(blocks.make(first)));
  EXPECT_EQ(drain_all(lists).size(), 1u);
  EXPECT_TRUE(lists.push(blocks.make(second)));
}

// ---------------------------------------------------------------------------------------
// randomized, against per-size stacks

TEST(QuickLists, RandomOperationsMatchPerSizeStacks) {
  // The reference keeps one stack per size. Slot sharing is not modelled (it depends on the
  // hash); instead every refusal must be explained: the lists are full, or the size has no
  // blocks parked while some other size has. Size pairs seen to coexist, or seen to clash
  // with only one candidate, must behave the same way ever after.
  std::mt19937_64 rng(20261201);
  QuickLists lists;
  Blocks blocks;
  // 32 sizes spread over 1 MiB: consecutive multiples of 512 land in distinct slots (the
  // hash is Fibonacci hashing), scattered ones share slots often.
  std::set<std::size_t> distinct;
  while (distinct.size() < 32) distinct.insert((1 + rng() % 2048) * kUnit);
  const std::vector<std::size_t> sizes(distinct.begin(), distinct.end());
  std::map<std::size_t, std::vector<Block*>> expected;
  std::vector<Block*> loose;                            // free blocks not parked, reused for pushes
  std::set<std::pair<std::size_t, std::size_t>> apart;  // seen parked together
  std::set<std::pair<std::size_t, std::size_t>> clash;  // proven to share a slot
  auto ordered = [](std::size_t a, std::size_t b) {
    return std::pair{std::min(a, b), std::max(a, b)};
  };
  std::size_t parked = 0;
  std::size_t parked_bytes = 0;
  std::size_t full_refusals = 0;
  std::size_t slot_refusals = 0;

  for (int step = 0; step < 20000; ++step) {
    const std::size_t size = sizes[rng() % sizes.size()];
    const auto op = static_cast<unsigned>(rng() % 100);
    // Push-heavy phases fill the lists to kMaxBlocks; pop-heavy ones empty them. Drains
    // come once per cycle and now and then at random.
    const bool filling = (step / 1500) % 2 == 0;
    const bool drain = step % 3000 == 2250 || rng() % 1000 == 0;
    if (!drain && op < (filling ? 70u : 30u)) {  // push
      Block* b = nullptr;
      auto it = std::find_if(loose.begin(), loose.end(), [&](Block* x) { return x->size == size; });
      if (it != loose.end()) {
        b = *it;
        loose.erase(it);
      } else {
        b = blocks.make(size);
      }
      std::vector<std::size_t> others;  // sizes with blocks parked, other than `size`
      for (const auto& [s, stack] : expected) {
        if (s != size && !stack.empty()) others.push_back(s);
      }
      const bool accepted = lists.push(b);
      std::vector<Block*>& stack = expected[size];
      if (accepted) {
        EXPECT_LT(parked, QuickLists::kMaxBlocks);
        EXPECT_TRUE(b->cached);
        for (std::size_t s : others) {
          if (stack.empty()) {
            EXPECT_EQ(clash.count(ordered(s, size)), 0u) << s << " and " << size;
            apart.insert(ordered(s, size));
          }
        }
        stack.push_back(b);
        ++parked;
        parked_bytes += size;
      } else {
        EXPECT_FALSE(b->cached);
        loose.push_back(b);
        if (parked == QuickLists::kMaxBlocks) {
          ++full_refusals;
        } else {
          EXPECT_TRUE(stack.empty()) << "a size with blocks parked holds its slot";
          std::vector<std::size_t> candidates;
          for (std::size_t s : others) {
            if (apart.count(ordered(s, size)) == 0) candidates.push_back(s);
          }
          EXPECT_FALSE(candidates.empty()) << "refusal of " << size << " unexplained";
          if (candidates.size() == 1) clash.insert(ordered(candidates[0], size));
          ++slot_refusals;
        }
      }
    } else if (!drain) {  // pop
      std::vector<Block*>& stack = expected[size];
      Block* got = lists.pop(size);
      if (stack.empty()) {
        EXPECT_EQ(got, nullptr) << "pop " << size;
      } else {
        EXPECT_EQ(got, stack.back()) << "pop " << size;
        stack.pop_back();
        --parked;
        parked_bytes -= size;
      }
      if (got != nullptr) {
        EXPECT_FALSE(got->cached);
        EXPECT_EQ(got->next_cached, nullptr);
        loose.push_back(got);
      }
    } else {  // drain
      std::multiset<Block*> released;
      lists.drain([&](Block* b) { released.insert(b); });
      std::multiset<Block*> want;
      for (auto& [s, stack] : expected) {
        want.insert(stack.begin(), stack.end());
        loose.insert(loose.end(), stack.begin(), stack.end());
        stack.clear();
      }
      EXPECT_EQ(released, want);
      parked = 0;
      parked_bytes = 0;
    }
    EXPECT_EQ(lists.count(), parked);
    EXPECT_EQ(lists.bytes(), parked_bytes);
    for (const auto& [s, stack] : expected) {
      for (const Block* b : stack) EXPECT_TRUE(b->cached);
    }
    for (const Block* b : loose) EXPECT_FALSE(b->cached);
    if (::testing::Test::HasFailure()) FAIL() << "first failure at step " << step;
  }
  EXPECT_GT(slot_refusals, 0u) << "the run never exercised slot sharing";
  EXPECT_FALSE(clash.empty()) << "no refusal pinned down which size held the slot";
  EXPECT_GT(full_refusals, 0u) << "the run never filled the lists";
}

}  // namespace
}  // namespace sdalloc::detail
