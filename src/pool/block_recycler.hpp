// block_recycler.hpp - a free list of Block records (internal).
//
// Splitting a block needs a new record and merging frees one. Records are carved from
// chunks of kChunk and recycled through an intrusive free list (the `next` link), so in a
// steady state the pool allocates no heap memory. The recycler owns every chunk until it
// is destroyed, so records may move between shards freely. Not thread-safe: the pool
// guards it with its own lock.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "pool/block.hpp"

namespace sdalloc::detail {

class BlockRecycler {
 public:
  // Ensures `n` records can be taken without allocating; call on a path that may allocate.
  void reserve(std::size_t n) {
    while (available_ < n) add_chunk();
  }

  Block* take() {
    if (free_ == nullptr) add_chunk();
    Block* block = free_;
    free_ = block->next;
    --available_;
    *block = Block{};
    return block;
  }

  void give_back(Block* block) {
    delete block->other_streams;
    block->other_streams = nullptr;
    block->next = free_;
    free_ = block;
    ++available_;
  }

  std::size_t available() const { return available_; }

 private:
  static constexpr std::size_t kChunk = 256;

  void add_chunk() {
    chunks_.push_back(std::make_unique<Block[]>(kChunk));
    Block* chunk = chunks_.back().get();
    for (std::size_t i = 0; i < kChunk; ++i) {
      chunk[i].next = free_;
      free_ = &chunk[i];
    }
    available_ += kChunk;
  }

  std::vector<std::unique_ptr<Block[]>> chunks_;
  Block* free_ = nullptr;
  std::size_t available_ = 0;
};

}  // namespace sdalloc::detail
