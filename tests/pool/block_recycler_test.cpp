// Unit tests of BlockRecycler, the free list of Block records.
//
// What the pool relies on: take() hands out a record no one else holds, reset to a fresh
// Block whatever its last user left in it; give_back() makes the record available again and
// frees its out-of-line stream list; reserve(n) makes n takes possible without carving more
// records (the hot path must not allocate); records never move while the recycler lives.

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <set>
#include <unordered_set>
#include <vector>

#include "pool/block.hpp"
#include "pool/block_recycler.hpp"
#include "sdalloc/core/stream.hpp"

namespace sdalloc::detail {
namespace {

void expect_fresh(const Block* b) {
  EXPECT_EQ(b->addr, 0u);
  EXPECT_EQ(b->size, 0u);
  EXPECT_EQ(b->requested, 0u);
  EXPECT_EQ(b->segment, nullptr);
  EXPECT_EQ(b->prev, nullptr);
  EXPECT_EQ(b->next, nullptr);
  EXPECT_TRUE(b->free);
  EXPECT_FALSE(b->indexed);
  EXPECT_FALSE(b->cached);
  EXPECT_EQ(b->next_cached, nullptr);
  EXPECT_EQ(b->left, nullptr);
  EXPECT_EQ(b->right, nullptr);
  EXPECT_EQ(b->priority, 0u);
  EXPECT_EQ(b->other_streams, nullptr);
}

// Fills every field, as a live block in a split segment would have them.
void dirty(Block* b, Block* neighbour) {
  b->addr = 4096;
  b->size = 1024;
  b->requested = 1000;
  b->prev = b->next = b->left = b->right = b->next_cached = neighbour;
  b->free = false;
  b->indexed = b->cached = true;
  b->priority = 77;
}

TEST(BlockRecycler, NewRecyclerHoldsNoRecords) {
  BlockRecycler recycler;
  EXPECT_EQ(recycler.available(), 0u);
  recycler.reserve(0);
  EXPECT_EQ(recycler.available(), 0u) << "reserve(0) carves nothing";
}

TEST(BlockRecycler, TakeReturnsAFreshRecord) {
  BlockRecycler recycler;
  Block* b = recycler.take();
  ASSERT_NE(b, nullptr);
  expect_fresh(b);
}

TEST(BlockRecycler, ReusedRecordIsResetToFresh) {
  BlockRecycler recycler;
  Block* b = recycler.take();
  Block* neighbour = recycler.take();
  dirty(b, neighbour);
  b->other_streams = new std::vector<Stream>{Stream(1), Stream(2)};
  recycler.give_back(b);
  EXPECT_EQ(b->other_streams, nullptr) << "give_back frees the stream list";
  Block* again = recycler.take();
  EXPECT_EQ(again, b) << "the record given back last is taken first";
  expect_fresh(again);
}

TEST(BlockRecycler, GiveBackMakesTheRecordAvailable) {
  BlockRecycler recycler;
  Block* b = recycler.take();
  const std::size_t before = recycler.available();
  recycler.give_back(b);
  EXPECT_EQ(recycler.available(), before + 1);
}

TEST(BlockRecycler, TakeWhenEmptyCarvesMoreRecords) {
  BlockRecycler recycler;
  recycler.take();
  const std::size_t carved = recycler.available() + 1;
  ASSERT_GT(carved, 1u) << "records come in chunks";
  std::unordered_set<Block*> held;
  for (std::size_t i = 1; i < carved; ++i) held.insert(recycler.take());
  EXPECT_EQ(recycler.available(), 0u);
  Block* b = recycler.take();
  EXPECT_EQ(held.count(b), 0u);
  EXPECT_EQ(recycler.available(), carved - 1) << "one more chunk";
}

TEST(BlockRecycler, ReserveMakesRoomForThatManyTakes) {
  BlockRecycler recycler;
  constexpr std::size_t kWant = 300;  // more than one chunk
  recycler.reserve(kWant);
  const std::size_t available = recycler.available();
  ASSERT_GE(available, kWant);
  std::unordered_set<Block*> taken;
  for (std::size_t i = 0; i < kWant; ++i) {
    taken.insert(recycler.take());
    ASSERT_EQ(recycler.available(), available - i - 1) << "take " << i << " carved records";
  }
  EXPECT_EQ(taken.size(), kWant);
  recycler.reserve(available - kWant);
  EXPECT_EQ(recycler.available(), available - kWant) << "enough left: reserve carves nothing";
}

TEST(BlockRecycler, RecordsStayPutAsTheRecyclerGrows) {
  // The pool links records to each other; carving new chunks must not move old records.
  BlockRecycler recycler;
  std::vector<Block*> held;
  for (std::uintptr_t i = 0; i < 2000; ++i) {
    Block* b = recycler.take();
    b->addr = i + 1;
    held.push_back(b);
  }
  for (std::uintptr_t i = 0; i < held.size(); ++i) EXPECT_EQ(held[i]->addr, i + 1);
}

TEST(BlockRecycler, RandomTakesAndGiveBacksNeverShareARecord) {
  std::mt19937_64 rng(20261201);
  BlockRecycler recycler;
  std::vector<Block*> held;
  std::set<Block*> held_set;
  std::size_t carved = 0;  // records carved so far: held + available
  for (int step = 0; step < 20000; ++step) {
    if (held.empty() || rng() % 100 < 55) {
      const std::size_t before = recycler.available();
      Block* b = recycler.take();
      expect_fresh(b);
      ASSERT_TRUE(held_set.insert(b).second) << "record handed out twice";
      held.push_back(b);
      if (before == 0) carved = held.size() + recycler.available();
      if (rng() % 4 == 0)
        b->other_streams = new std::vector<Stream>{Stream(static_cast<std::uintptr_t>(step))};
      b->addr = static_cast<std::uintptr_t>(step) + 1;
    } else {
      const std::size_t i = rng() % held.size();
      Block* b = held[i];
      held[i] = held.back();
      held.pop_back();
      held_set.erase(b);
      recycler.give_back(b);
    }
    EXPECT_EQ(held.size() + recycler.available(), carved);
    if (::testing::Test::HasFailure()) FAIL() << "first failure at step " << step;
  }
  for (Block* b : held) recycler.give_back(b);  // frees the remaining stream lists
}

}  // namespace
}  // namespace sdalloc::detail
