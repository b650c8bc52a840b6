// quick_lists.hpp - recently freed blocks by exact size, not yet merged (internal).
//
// Inference repeats the same tensor sizes over and over. A block freed with a size that
// will be asked for again is parked here, unmerged, and handed straight back by the next
// request of that size: a push and a pop instead of two tree updates and a merge. This is
// dlmalloc's "fast bins" idea. The pool drains every list (merging the blocks into the
// free index) before it searches the index in vain, moves or releases a segment, or
// reports figures, so deferring the merge never makes it grow or fail.
//
// A small direct-mapped table: a slot holds one size at a time; a free whose slot is held
// by another size, or that would pass kMaxBlocks, is merged at once instead.
#pragma once

#include <cstddef>
#include <cstdint>

#include "pool/block.hpp"

namespace sdalloc::detail {

class QuickLists {
 public:
  static constexpr std::size_t kSlots = 64;
  static constexpr std::size_t kMaxBlocks = 256;

  Block* pop(std::size_t size) {
    Slot& slot = slot_of(size);
    Block* block = slot.head;
    if (block == nullptr || slot.size != size) return nullptr;
    slot.head = block->next_cached;
    --count_;
    bytes_ -= size;
    block->cached = false;
    block->next_cached = nullptr;
    return block;
  }

  // Parks a free block; answers false (and leaves it alone) when there is no room.
  bool push(Block* block) {
    Slot& slot = slot_of(block->size);
    if (count_ == kMaxBlocks || (slot.head != nullptr && slot.size != block->size)) {
      return false;
    }
    slot.size = block->size;
    block->next_cached = slot.head;
    block->cached = true;
    slot.head = block;
    ++count_;
    bytes_ += block->size;
    return true;
  }

  // Empties every list, handing each block to `release` (which merges it).
  template <typename Release>
  void drain(Release&& release) {
    if (count_ == 0) return;
    for (Slot& slot : slots_) {
      while (Block* block = slot.head) {
        slot.head = block->next_cached;
        block->cached = false;
        block->next_cached = nullptr;
        release(block);
      }
    }
    count_ = 0;
    bytes_ = 0;
  }

  std::size_t count() const { return count_; }
  std::size_t bytes() const { return bytes_; }

 private:
  struct Slot {
    std::size_t size = 0;
    Block* head = nullptr;
  };

  Slot& slot_of(std::size_t size) {
    // Sizes are multiples of 512; mix the rest so nearby sizes spread over the slots.
    return slots_[((size >> 9) * 0x9E3779B97F4A7C15ULL) >> (64 - 6)];
  }

  Slot slots_[kSlots];
  std::size_t count_ = 0;
  std::size_t bytes_ = 0;
};

static_assert(QuickLists::kSlots == 64, "slot_of() takes the top 6 bits");

}  // namespace sdalloc::detail
