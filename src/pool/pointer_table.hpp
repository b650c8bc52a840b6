// pointer_table.hpp - live allocations by address: pointer -> Block (internal).
//
// Open addressing with linear probing and backward-shift deletion (no tombstones, so a
// long-running pool never degrades). The table doubles when it becomes half full; that is
// the only allocation it makes, and it happens only when the number of live allocations
// reaches a new high. Addresses are at least 512-byte aligned, so the low 9 bits carry no
// information and are shifted out before hashing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "pool/block.hpp"

namespace sdalloc::detail {

class PointerTable {
 public:
  PointerTable() { rehash(kInitialCapacity); }

  Block* find(std::uintptr_t addr) const {
    for (std::size_t i = slot_of(addr);; i = (i + 1) & mask_) {
      const Entry& e = entries_[i];
      if (e.addr == addr) return e.block;
      if (e.addr == 0) return nullptr;
    }
  }

  // Makes room for one more entry; call before insert() on a path that may allocate.
  void reserve_one() {
    if ((size_ + 1) * 2 > capacity_) rehash(capacity_ * 2);
  }

  // The address must not be present. reserve_one() must have been called.
  void insert(std::uintptr_t addr, Block* block) {
    std::size_t i = slot_of(addr);
    while (entries_[i].addr != 0) i = (i + 1) & mask_;
    entries_[i] = Entry{addr, block};
    ++size_;
  }

  // Removes the address if present; answers whether it was.
  bool erase(std::uintptr_t addr) {
    if (addr == 0) return false;  // 0 marks an empty slot: the probe below would "find" one
    std::size_t i = slot_of(addr);
    while (entries_[i].addr != addr) {
      if (entries_[i].addr == 0) return false;
      i = (i + 1) & mask_;
    }
    // Backward shift: pull later entries of the probe run into the hole when their home
    // slot does not lie (cyclically) between the hole and their current slot.
    std::size_t hole = i;
    for (std::size_t j = (hole + 1) & mask_; entries_[j].addr != 0; j = (j + 1) & mask_) {
      const std::size_t home = slot_of(entries_[j].addr);
      const bool home_in_gap = ((j - home) & mask_) < ((j - hole) & mask_);
      if (!home_in_gap) {
        entries_[hole] = entries_[j];
        hole = j;
      }
    }
    entries_[hole] = Entry{};
    --size_;
    return true;
  }

  std::size_t size() const { return size_; }

  template <typename Visit>
  void for_each(Visit&& visit) const {
    for (std::size_t i = 0; i < capacity_; ++i) {
      if (entries_[i].addr != 0) visit(entries_[i].addr, entries_[i].block);
    }
  }

 private:
  struct Entry {
    std::uintptr_t addr = 0;
    Block* block = nullptr;
  };
  static constexpr std::size_t kInitialCapacity = 64;

  std::size_t slot_of(std::uintptr_t addr) const {
    return static_cast<std::size_t>(((addr >> 9) * 0x9E3779B97F4A7C15ULL) >> shift_);
  }

  void rehash(std::size_t capacity) {
    std::unique_ptr<Entry[]> old = std::move(entries_);
    const std::size_t old_capacity = capacity_;
    entries_ = std::make_unique<Entry[]>(capacity);
    capacity_ = capacity;
    mask_ = capacity - 1;
    shift_ = 64 - static_cast<unsigned>(__builtin_ctzll(capacity));
    size_ = 0;
    for (std::size_t i = 0; i < old_capacity; ++i) {
      if (old[i].addr != 0) insert(old[i].addr, old[i].block);
    }
  }

  std::unique_ptr<Entry[]> entries_;
  std::size_t capacity_ = 0;
  std::size_t mask_ = 0;
  unsigned shift_ = 64;
  std::size_t size_ = 0;
};

}  // namespace sdalloc::detail
