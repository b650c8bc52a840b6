// holdings.hpp - what a test holds, each allocation filled with a pattern of its own, for
// pool tests that move memory around: a page mapped under two live allocations, or moved
// away from a live one, shows as a wrong byte. And a way to make free gaps between them.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

namespace sdalloc::test {

// Pointer -> (size, pattern); every byte of an allocation is written with its pattern.
class Holdings {
 public:
  void add(void* ptr, std::size_t size) {
    const auto pattern = static_cast<unsigned char>(1 + next_++ % 251);
    std::memset(ptr, pattern, size);
    held_[ptr] = {size, pattern};
  }
  std::size_t remove(void* ptr) {
    const std::size_t size = held_.at(ptr).first;
    held_.erase(ptr);
    return size;
  }
  ::testing::AssertionResult intact() const {
    for (const auto& [ptr, entry] : held_) {
      const auto* bytes = static_cast<const unsigned char*>(ptr);
      for (std::size_t i = 0; i < entry.first; i += 97) {
        if (bytes[i] != entry.second) {
          return ::testing::AssertionFailure()
                 << "byte " << i << " of the allocation at " << ptr << " (" << entry.first
                 << " bytes) reads " << int(bytes[i]) << ", expected " << int(entry.second);
        }
      }
      if (bytes[entry.first - 1] != entry.second) {
        return ::testing::AssertionFailure() << "last byte of " << ptr << " changed";
      }
    }
    return ::testing::AssertionSuccess();
  }
  const std::map<void*, std::pair<std::size_t, unsigned char>>& all() const { return held_; }
  bool empty() const { return held_.empty(); }

 private:
  std::map<void*, std::pair<std::size_t, unsigned char>> held_;
  unsigned next_ = 0;
};

// `count` blocks of `bytes`, held, then every other one (the even ones) freed again: free
// gaps between live blocks. Answers all the pointers.
template <class Pool>
std::vector<void*> allocate_then_free_every_other(Pool& pool, Holdings& held, int count,
                                                  std::size_t bytes) {
  std::vector<void*> blocks;
  for (int i = 0; i < count; ++i) {
    blocks.push_back(pool.allocate(bytes));
    held.add(blocks.back(), bytes);
  }
  for (int i = 0; i < count; i += 2) pool.deallocate(blocks[i], held.remove(blocks[i]));
  return blocks;
}

// Frees every allocation `held` still has, in address order, and forgets it.
template <typename Pool>
void deallocate_all(Pool& pool, Holdings& held) {
  for (const auto& [ptr, entry] : std::map(held.all())) pool.deallocate(ptr, held.remove(ptr));
}

}  // namespace sdalloc::test
