// tools/sdalloc/replay/torch_block_pool.hpp - the blocks of the PyTorch caching-allocator model.
//
// A Block is one piece of a segment, free or handed out, as in PyTorch's CUDA caching
// allocator (c10/cuda/CUDACachingAllocator.cpp): the blocks of one segment form a list in
// address order (prev, next), so a freed block merges only with the pieces of its own
// segment, never with another segment that happens to lie next to it in memory.
// A BlockPool holds the free blocks of one size class (the small pool, requests of at most
// 1 MiB, or the large pool), ordered as PyTorch orders them for best fit: by stream, then
// size, then address. With expandable segments it also holds the unmapped stretches of the
// pool's ranges, by stream and address. BlockStore recycles Block objects, so a split or a
// merge in steady state allocates nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <set>
#include <vector>

namespace sdalloc::replay {

class ExpandableSegment;

struct Block {
  std::uintptr_t stream = 0;  // the stream it was allocated on; reused only there
  std::size_t size = 0;       // bytes, a multiple of 512
  char* ptr = nullptr;
  std::size_t requested = 0;  // bytes asked for, while allocated
  bool small = false;         // in the small pool
  bool allocated = false;
  bool mapped = true;  // false: unmapped address space of an expandable segment
  Block* prev = nullptr;
  Block* next = nullptr;
  ExpandableSegment* segment = nullptr;  // the expandable segment it lies in, if any

  bool is_split() const { return prev != nullptr || next != nullptr; }
};

// Best fit: the first block not below (stream, size, address 0) is the smallest that fits.
struct BlockBySize {
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream != b->stream) return a->stream < b->stream;
    if (a->size != b->size) return a->size < b->size;
    return a->ptr < b->ptr;
  }
};

struct BlockByAddress {
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream != b->stream) return a->stream < b->stream;
    return a->ptr < b->ptr;
  }
};

struct BlockPool {
  explicit BlockPool(bool is_small) : small(is_small) {}
  bool small;
  std::set<Block*, BlockBySize> free;         // mapped blocks that are not allocated
  std::set<Block*, BlockByAddress> unmapped;  // expandable segments' unmapped stretches
};

// Owns every Block; make() reuses the ones drop() gave back.
class BlockStore {
 public:
  Block* make(const Block& value) {
    Block* block = nullptr;
    if (spare_.empty()) {
      block = &storage_.emplace_back();
    } else {
      block = spare_.back();
      spare_.pop_back();
    }
    *block = value;
    return block;
  }
  void drop(Block* block) { spare_.push_back(block); }

 private:
  std::deque<Block> storage_;  // stable addresses
  std::vector<Block*> spare_;
};

}  // namespace sdalloc::replay
