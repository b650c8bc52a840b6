// free_block_index.hpp - free blocks ordered by (size, address), for best fit (internal).
//
// A treap: a binary search tree on (size, addr) that is also a heap on a per-block
// priority. The priority is a hash of the address, so the shape is that of a random tree
// (expected depth O(log n)) yet fully deterministic, which keeps replays reproducible.
// Intrusive: the links live in Block, so inserting and removing never allocate.
//
// best_fit(n) returns the smallest block of at least n bytes, the lowest address among
// equals: classic best fit, which keeps large free blocks whole for large requests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "pool/block.hpp"

namespace sdalloc::detail {

class FreeBlockIndex {
 public:
  void insert(Block* block) {
    block->priority = priority_of(block->addr);
    block->left = block->right = nullptr;
    block->indexed = true;
    auto [less, greater_or_equal] = split(root_, block->size, block->addr);
    root_ = merge(merge(less, block), greater_or_equal);
    ++count_;
    bytes_ += block->size;
  }

  void erase(Block* block) {
    auto [less, rest] = split(root_, block->size, block->addr);
    auto [found, greater] = split(rest, block->size, block->addr + 1);
    // `found` is exactly `block`: keys are unique because addresses are.
    (void)found;
    root_ = merge(less, greater);
    block->left = block->right = nullptr;
    block->indexed = false;
    --count_;
    bytes_ -= block->size;
  }

  // Smallest block with size >= bytes (lowest address on ties), or nullptr.
  Block* best_fit(std::size_t bytes) const {
    Block* best = nullptr;
    for (Block* node = root_; node != nullptr;) {
      if (node->size >= bytes) {
        best = node;
        node = node->left;
      } else {
        node = node->right;
      }
    }
    return best;
  }

  // The next block in (size, addr) order after `block`, or nullptr. O(log n).
  Block* successor(const Block* block) const {
    Block* succ = nullptr;
    for (Block* node = root_; node != nullptr;) {
      if (less(block->size, block->addr, node->size, node->addr)) {
        succ = node;
        node = node->left;
      } else {
        node = node->right;
      }
    }
    return succ;
  }

  // The block before `block` in (size, addr) order, or nullptr. O(log n).
  Block* predecessor(const Block* block) const {
    Block* pred = nullptr;
    for (Block* node = root_; node != nullptr;) {
      if (less(node->size, node->addr, block->size, block->addr)) {
        pred = node;
        node = node->right;
      } else {
        node = node->left;
      }
    }
    return pred;
  }

  Block* largest() const {
    Block* node = root_;
    while (node != nullptr && node->right != nullptr) node = node->right;
    return node;
  }

  std::size_t count() const { return count_; }
  std::size_t bytes() const { return bytes_; }
  bool empty() const { return root_ == nullptr; }

  // Visits every block in (size, addr) order; for invariant checks and statistics.
  template <typename Visit>
  void for_each(Visit&& visit) const {
    visit_in_order(root_, visit);
  }

 private:
  static bool less(std::size_t size_a, std::uintptr_t addr_a, std::size_t size_b,
                   std::uintptr_t addr_b) {
    return size_a < size_b || (size_a == size_b && addr_a < addr_b);
  }

  static std::uint32_t priority_of(std::uintptr_t addr) {
    std::uint64_t x = addr;  // splitmix64 finaliser: cheap and well mixed
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return static_cast<std::uint32_t>(x);
  }

  // Splits `node` into the blocks ordered before (size, addr) and the rest.
  static std::pair<Block*, Block*> split(Block* node, std::size_t size, std::uintptr_t addr) {
    if (node == nullptr) return {nullptr, nullptr};
    if (less(node->size, node->addr, size, addr)) {
      auto [l, r] = split(node->right, size, addr);
      node->right = l;
      return {node, r};
    }
    auto [l, r] = split(node->left, size, addr);
    node->left = r;
    return {l, node};
  }

  // Joins two treaps where every key of `a` orders before every key of `b`.
  static Block* merge(Block* a, Block* b) {
    if (a == nullptr) return b;
    if (b == nullptr) return a;
    if (a->priority >= b->priority) {
      a->right = merge(a->right, b);
      return a;
    }
    b->left = merge(a, b->left);
    return b;
  }

  template <typename Visit>
  static void visit_in_order(Block* node, Visit& visit) {
    if (node == nullptr) return;
    visit_in_order(node->left, visit);
    visit(node);
    visit_in_order(node->right, visit);
  }

  Block* root_ = nullptr;
  std::size_t count_ = 0;
  std::size_t bytes_ = 0;
};

}  // namespace sdalloc::detail
