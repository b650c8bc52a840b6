// Unit tests of FreeBlockIndex, the treap of free blocks keyed by (size, addr).
//
// The pool relies on three properties, checked here apart from the pool: best_fit(n) is the
// smallest block of at least n bytes, lowest address among equals; successor() walks the
// blocks in (size, addr) order (the pool scans best_fit, successor, ... for a usable block),
// predecessor() the other way (largest, predecessor, ...: the pages a VirtualMemoryPool moves);
// and the tree stays a valid treap (search order on the key, heap order on the priority)
// through every insert and erase, so its depth stays logarithmic. check_treap() verifies the
// structure through the intrusive links in Block after each step.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <iterator>
#include <random>
#include <set>
#include <unordered_set>
#include <utility>
#include <vector>

#include "pool/block.hpp"
#include "pool/free_block_index.hpp"

namespace sdalloc::detail {
namespace {

constexpr std::size_t kUnit = 512;  // pool blocks are multiples of 512 bytes, 512-aligned

using Key = std::pair<std::size_t, std::uintptr_t>;  // (size, addr), the index's order

// Owns Block records at stable addresses (a deque never moves its elements).
class Blocks {
 public:
  Block* make(std::size_t size, std::uintptr_t addr) {
    Block& b = records_.emplace_back();
    b.size = size;
    b.addr = addr;
    return &b;
  }

 private:
  std::deque<Block> records_;
};

// ---------------------------------------------------------------------------------------
// structural check

// The root is the one indexed block that is nobody's child.
const Block* root_of(const FreeBlockIndex& index) {
  std::vector<const Block*> all;
  std::unordered_set<const Block*> children;
  index.for_each([&](const Block* b) {
    all.push_back(b);
    if (b->left != nullptr) children.insert(b->left);
    if (b->right != nullptr) children.insert(b->right);
  });
  const Block* root = nullptr;
  for (const Block* b : all) {
    if (children.count(b) == 0) {
      EXPECT_EQ(root, nullptr) << "two blocks without a parent";
      root = b;
    }
  }
  return root;
}

struct TreeFacts {
  std::size_t nodes = 0;
  std::size_t depth = 0;
};

// Checks search order within (lo, hi) and heap order on priority below `node`.
TreeFacts check_subtree(const Block* node, const Block* lo, const Block* hi) {
  if (node == nullptr) return {};
  const Key key{node->size, node->addr};
  if (lo != nullptr) {
    EXPECT_LT((Key{lo->size, lo->addr}), key) << "search order broken";
  }
  if (hi != nullptr) {
    EXPECT_LT(key, (Key{hi->size, hi->addr})) << "search order broken";
  }
  for (const Block* child : {node->left, node->right}) {
    if (child != nullptr) {
      EXPECT_GE(node->priority, child->priority) << "heap order broken";
    }
  }
  EXPECT_TRUE(node->indexed);
  const TreeFacts l = check_subtree(node->left, lo, node);
  const TreeFacts r = check_subtree(node->right, node, hi);
  return {l.nodes + r.nodes + 1, std::max(l.depth, r.depth) + 1};
}

// Verifies the index against the reference set of keys; returns the tree's depth.
std::size_t check_treap(const FreeBlockIndex& index, const std::set<Key>& expected) {
  std::vector<Key> visited;
  std::size_t bytes = 0;
  index.for_each([&](const Block* b) {
    visited.emplace_back(b->size, b->addr);
    bytes += b->size;
  });
  EXPECT_EQ(visited, std::vector<Key>(expected.begin(), expected.end()));
  EXPECT_EQ(index.count(), expected.size());
  EXPECT_EQ(index.bytes(), bytes);
  EXPECT_EQ(index.empty(), expected.empty());
  const TreeFacts facts = check_subtree(root_of(index), nullptr, nullptr);
  EXPECT_EQ(facts.nodes, expected.size()) << "blocks unreachable from the root";
  return facts.depth;
}

// ---------------------------------------------------------------------------------------
// empty and one block

TEST(FreeBlockIndex, EmptyIndexFindsNothing) {
  FreeBlockIndex index;
  EXPECT_TRUE(index.empty());
  EXPECT_EQ(index.count(), 0u);
  EXPECT_EQ(index.bytes(), 0u);
  EXPECT_EQ(index.best_fit(0), nullptr);
  EXPECT_EQ(index.best_fit(kUnit), nullptr);
  EXPECT_EQ(index.largest(), nullptr);
  Block probe;
  probe.size = kUnit;
  probe.addr = kUnit;
  EXPECT_EQ(index.successor(&probe), nullptr);
  std::size_t visits = 0;
  index.for_each([&](const Block*) { ++visits; });
  EXPECT_EQ(visits, 0u);
}

TEST(FreeBlockIndex, InsertMarksBlockIndexedAndCountsIt) {
  Blocks blocks;
  FreeBlockIndex index;
  Block* b = blocks.make(4 * kUnit, 8 * kUnit);
  index.insert(b);
  EXPECT_TRUE(b->indexed);
  EXPECT_FALSE(index.empty());
  EXPECT_EQ(index.count(), 1u);
  EXPECT_EQ(index.bytes(), 4 * kUnit);
  EXPECT_EQ(index.largest(), b);
  EXPECT_EQ(index.successor(b), nullptr);
}

TEST(FreeBlockIndex, SingleBlockFitsRequestsUpToItsSize) {
  Blocks blocks;
  FreeBlockIndex index;
  Block* b = blocks.make(4 * kUnit, 8 * kUnit);
  index.insert(b);
  EXPECT_EQ(index.best_fit(0), b);
  EXPECT_EQ(index.best_fit(1), b);
  EXPECT_EQ(index.best_fit(4 * kUnit), b);
  EXPECT_EQ(index.best_fit(4 * kUnit + 1), nullptr);
}

TEST(FreeBlockIndex, RemovingTheOnlyBlockEmptiesTheIndex) {
  Blocks blocks;
  FreeBlockIndex index;
  Block* b = blocks.make(4 * kUnit, 8 * kUnit);
  index.insert(b);
  index.erase(b);
  EXPECT_FALSE(b->indexed);
  EXPECT_EQ(b->left, nullptr);
  EXPECT_EQ(b->right, nullptr);
  check_treap(index, {});
  EXPECT_EQ(index.best_fit(0), nullptr);
  EXPECT_EQ(index.largest(), nullptr);
}

// ---------------------------------------------------------------------------------------
// best fit

TEST(FreeBlockIndex, BestFitPicksSmallestBlockThatFits) {
  Blocks blocks;
  FreeBlockIndex index;
  Block* b8 = blocks.make(8 * kUnit, 100 * kUnit);
  Block* b2 = blocks.make(2 * kUnit, 200 * kUnit);
  Block* b5 = blocks.make(5 * kUnit, 300 * kUnit);
  Block* b16 = blocks.make(16 * kUnit, 400 * kUnit);
  for (Block* b : {b8, b2, b5, b16}) index.insert(b);
  EXPECT_EQ(index.best_fit(1), b2);
  EXPECT_EQ(index.best_fit(2 * kUnit), b2);
  EXPECT_EQ(index.best_fit(2 * kUnit + 1), b5);
  EXPECT_EQ(index.best_fit(5 * kUnit), b5);
  EXPECT_EQ(index.best_fit(6 * kUnit), b8);
  EXPECT_EQ(index.best_fit(9 * kUnit), b16);
  EXPECT_EQ(index.best_fit(16 * kUnit), b16);
  EXPECT_EQ(index.best_fit(17 * kUnit), nullptr);
}

TEST(FreeBlockIndex, TiesBreakByLowestAddress) {
  Blocks blocks;
  FreeBlockIndex index;
  // Same size at scattered addresses, inserted out of address order.
  Block* high = blocks.make(4 * kUnit, 900 * kUnit);
  Block* low = blocks.make(4 * kUnit, 100 * kUnit);
  Block* mid = blocks.make(4 * kUnit, 500 * kUnit);
  Block* bigger_lower = blocks.make(8 * kUnit, 10 * kUnit);
  for (Block* b : {high, low, mid, bigger_lower}) index.insert(b);
  EXPECT_EQ(index.best_fit(3 * kUnit), low);
  EXPECT_EQ(index.best_fit(4 * kUnit), low);
  index.erase(low);
  EXPECT_EQ(index.best_fit(4 * kUnit), mid);
  index.erase(mid);
  EXPECT_EQ(index.best_fit(4 * kUnit), high);
  index.erase(high);
  EXPECT_EQ(index.best_fit(4 * kUnit), bigger_lower);
}

TEST(FreeBlockIndex, LargestIsTheBiggestBlockAtTheHighestAddress) {
  Blocks blocks;
  FreeBlockIndex index;
  Block* small = blocks.make(kUnit, 1000 * kUnit);
  Block* big_low = blocks.make(32 * kUnit, 10 * kUnit);
  Block* big_high = blocks.make(32 * kUnit, 20 * kUnit);
  for (Block* b : {small, big_low, big_high}) index.insert(b);
  EXPECT_EQ(index.largest(), big_high);
  index.erase(big_high);
  EXPECT_EQ(index.largest(), big_low);
}

// ---------------------------------------------------------------------------------------
// successor

// Twelve blocks of three sizes at four places, inserted out of order; answers their keys.
std::set<Key> insert_grid(Blocks& blocks, FreeBlockIndex& index) {
  std::set<Key> keys;
  for (std::uintptr_t a : {7u, 3u, 9u, 1u}) {
    for (std::size_t s : {2u, 1u, 6u}) {
      const std::uintptr_t addr = (a * 16 + s) * kUnit;
      index.insert(blocks.make(s * kUnit, addr));
      keys.emplace(s * kUnit, addr);
    }
  }
  return keys;
}

TEST(FreeBlockIndex, SuccessorWalksBlocksInSizeThenAddressOrder) {
  Blocks blocks;
  FreeBlockIndex index;
  const std::set<Key> expected = insert_grid(blocks, index);
  std::vector<Key> walked;
  for (Block* b = index.best_fit(0); b != nullptr; b = index.successor(b)) {
    walked.emplace_back(b->size, b->addr);
  }
  EXPECT_EQ(walked, std::vector<Key>(expected.begin(), expected.end()));
}

TEST(FreeBlockIndex, NeighboursOfAnAbsentKeyAreTheIndexedKeysAroundIt) {
  Blocks blocks;
  FreeBlockIndex index;
  Block* a = blocks.make(2 * kUnit, 100 * kUnit);
  Block* b = blocks.make(2 * kUnit, 300 * kUnit);
  Block* c = blocks.make(4 * kUnit, 50 * kUnit);
  for (Block* x : {a, b, c}) index.insert(x);
  Block probe;
  probe.size = 2 * kUnit;
  probe.addr = 200 * kUnit;  // between a and b
  EXPECT_EQ(index.successor(&probe), b);
  probe.addr = 400 * kUnit;  // after every 2-unit block: the next size
  EXPECT_EQ(index.successor(&probe), c);
  probe.size = 8 * kUnit;
  EXPECT_EQ(index.successor(&probe), nullptr);
  // and the other way
  probe.size = 2 * kUnit;
  probe.addr = 200 * kUnit;
  EXPECT_EQ(index.predecessor(&probe), a);
  probe.size = 3 * kUnit;  // between the sizes
  EXPECT_EQ(index.predecessor(&probe), b);
  probe.size = kUnit;
  EXPECT_EQ(index.predecessor(&probe), nullptr);
}

// predecessor (VirtualMemoryPool walks largest, predecessor, ... for pages to move)

TEST(FreeBlockIndex, PredecessorWalksFromTheLargestBlockDown) {
  Blocks blocks;
  FreeBlockIndex index;
  const std::set<Key> expected = insert_grid(blocks, index);
  std::vector<Key> walked;
  for (Block* b = index.largest(); b != nullptr; b = index.predecessor(b)) {
    walked.emplace_back(b->size, b->addr);
  }
  EXPECT_EQ(walked, std::vector<Key>(expected.rbegin(), expected.rend()));
}

// ---------------------------------------------------------------------------------------
// erase

TEST(FreeBlockIndex, RemovedBlockIsNotFound) {
  Blocks blocks;
  FreeBlockIndex index;
  Block* small = blocks.make(2 * kUnit, 100 * kUnit);
  Block* fit = blocks.make(4 * kUnit, 200 * kUnit);
  Block* big = blocks.make(8 * kUnit, 300 * kUnit);
  for (Block* b : {small, fit, big}) index.insert(b);
  index.erase(fit);
  EXPECT_EQ(index.best_fit(3 * kUnit), big);
  EXPECT_EQ(index.successor(small), big);
  index.for_each([&](const Block* b) { EXPECT_NE(b, fit); });
  check_treap(index, {{2 * kUnit, 100 * kUnit}, {8 * kUnit, 300 * kUnit}});
}

TEST(FreeBlockIndex, RemovingTheRootKeepsTheTreapValid) {
  Blocks blocks;
  FreeBlockIndex index;
  std::set<Key> expected;
  for (std::uintptr_t i = 1; i <= 40; ++i) {
    const std::size_t size = (i % 5 + 1) * kUnit;
    index.insert(blocks.make(size, i * kUnit));
    expected.emplace(size, i * kUnit);
  }
  while (!expected.empty()) {
    Block* root = const_cast<Block*>(root_of(index));
    ASSERT_NE(root, nullptr);
    index.erase(root);
    expected.erase({root->size, root->addr});
    EXPECT_FALSE(root->indexed);
    check_treap(index, expected);
  }
}

TEST(FreeBlockIndex, ErasedBlockCanBeReinsertedWithANewSize) {
  // The pool erases a free block, grows it by merging with a neighbour, and inserts it again.
  Blocks blocks;
  FreeBlockIndex index;
  Block* b = blocks.make(2 * kUnit, 100 * kUnit);
  Block* other = blocks.make(3 * kUnit, 50 * kUnit);
  index.insert(b);
  index.insert(other);
  index.erase(b);
  b->size = 6 * kUnit;
  index.insert(b);
  EXPECT_EQ(index.bytes(), 9 * kUnit);
  EXPECT_EQ(index.best_fit(4 * kUnit), b);
  check_treap(index, {{3 * kUnit, 50 * kUnit}, {6 * kUnit, 100 * kUnit}});
}

// ---------------------------------------------------------------------------------------
// shape

TEST(FreeBlockIndex, AscendingInsertsStayShallow) {
  // Equal sizes at rising addresses (a pool carving one segment) would make a plain search
  // tree a list; the address-hash priority keeps the treap's depth logarithmic.
  Blocks blocks;
  FreeBlockIndex index;
  std::set<Key> expected;
  constexpr std::size_t kCount = 4096;
  for (std::uintptr_t i = 1; i <= kCount; ++i) {
    index.insert(blocks.make(kUnit, i * kUnit));
    expected.emplace(kUnit, i * kUnit);
  }
  const std::size_t depth = check_treap(index, expected);
  // A random tree on n keys is about 4.3 ln n deep (~36 for n = 4096); a list would be n.
  EXPECT_LE(depth, 48u);
}

TEST(FreeBlockIndex, ShapeDependsOnlyOnTheBlocks) {
  // Priorities are a hash of the address, so the same blocks give the same tree whatever the
  // insertion order: replays stay reproducible.
  Blocks blocks;
  std::vector<Block*> first;
  std::vector<Block*> second;
  for (std::uintptr_t i = 1; i <= 64; ++i) {
    first.push_back(blocks.make((i % 7 + 1) * kUnit, i * kUnit));
    second.push_back(blocks.make((i % 7 + 1) * kUnit, i * kUnit));
  }
  std::mt19937_64 rng(7);
  std::shuffle(second.begin(), second.end(), rng);
  FreeBlockIndex a;
  FreeBlockIndex b;
  for (Block* x : first) a.insert(x);
  for (Block* x : second) b.insert(x);
  const Block* ra = root_of(a);
  const Block* rb = root_of(b);
  ASSERT_NE(ra, nullptr);
  ASSERT_NE(rb, nullptr);
  EXPECT_EQ(ra->addr, rb->addr);
  // Same parent-child pairs, compared by address.
  auto edges = [](const FreeBlockIndex& index) {
    std::set<std::pair<std::uintptr_t, std::uintptr_t>> out;
    index.for_each([&](const Block* x) {
      if (x->left != nullptr) out.emplace(x->addr, x->left->addr);
      if (x->right != nullptr) out.emplace(x->addr, x->right->addr);
    });
    return out;
  };
  EXPECT_EQ(edges(a), edges(b));
}

// ---------------------------------------------------------------------------------------
// randomized, against std::set

TEST(FreeBlockIndex, RandomOperationsMatchAnOrderedSet) {
  std::mt19937_64 rng(20261201);
  Blocks blocks;
  FreeBlockIndex index;
  std::set<Key> expected;
  std::vector<Block*> indexed;  // members, for picking one at random
  std::vector<Block*> spare;    // erased records, reinserted with new sizes
  std::uintptr_t next_addr = kUnit;
  // Few distinct sizes, so equal keys (ties on size) are common.
  auto random_size = [&] { return (1 + rng() % 12) * kUnit; };
  auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % n); };

  for (int step = 0; step < 4000; ++step) {
    const auto op = static_cast<unsigned>(rng() % 10);
    if (op < 4 || indexed.empty()) {  // insert
      Block* b = nullptr;
      if (!spare.empty() && rng() % 2 == 0) {
        b = spare.back();
        spare.pop_back();
      } else {
        b = blocks.make(0, next_addr);
        next_addr += kUnit * (1 + rng() % 3);
      }
      b->size = random_size();
      index.insert(b);
      indexed.push_back(b);
      ASSERT_TRUE(expected.emplace(b->size, b->addr).second);
    } else if (op < 7) {  // erase
      const std::size_t i = pick(indexed.size());
      Block* b = indexed[i];
      indexed[i] = indexed.back();
      indexed.pop_back();
      index.erase(b);
      expected.erase({b->size, b->addr});
      EXPECT_FALSE(b->indexed);
      spare.push_back(b);
    } else if (op < 9) {  // best fit
      const std::size_t want = rng() % (14 * kUnit);
      const Block* got = index.best_fit(want);
      auto it = expected.lower_bound({want, 0});
      if (it == expected.end()) {
        EXPECT_EQ(got, nullptr) << "best_fit(" << want << ")";
      } else {
        ASSERT_NE(got, nullptr) << "best_fit(" << want << ")";
        EXPECT_EQ((Key{got->size, got->addr}), *it) << "best_fit(" << want << ")";
      }
    } else {  // successor of a member, and largest
      const Block* b = indexed[pick(indexed.size())];
      auto it = std::next(expected.find({b->size, b->addr}));
      const Block* got = index.successor(b);
      if (it == expected.end()) {
        EXPECT_EQ(got, nullptr);
      } else {
        ASSERT_NE(got, nullptr);
        EXPECT_EQ((Key{got->size, got->addr}), *it);
      }
      const Block* big = index.largest();
      ASSERT_NE(big, nullptr);
      EXPECT_EQ((Key{big->size, big->addr}), *expected.rbegin());
    }
    check_treap(index, expected);
    if (::testing::Test::HasFailure()) FAIL() << "first failure at step " << step;
  }
}

}  // namespace
}  // namespace sdalloc::detail
