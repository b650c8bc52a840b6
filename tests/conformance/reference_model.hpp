// reference_model.hpp - what a correct resource must look like after a sequence of calls.
//
// ReferenceModel is the oracle of the conformance suite. It knows every allocation the test
// still holds (address, size, stream, pattern byte) and checks what any resource, pool or
// plain, must guarantee:
//  - a result is aligned to the configuration's guaranteed alignment (>= kMinAlignment);
//  - no two live allocations overlap (checked exactly, on the ordered address map);
//  - memory keeps what was written to it until it is freed: each allocation gets its own
//    pattern byte, written to its first, middle and last bytes (all of it for small sizes)
//    and checked again when it is freed or on request. A resource that hands out memory
//    twice, or scribbles over a live block, changes some pattern.
// The pattern never uses 0, so fresh (zero) pages never pass for a written pattern.
//
// A model belongs to one thread; concurrent tests give each thread its own and merge them
// at a quiescent point to check for overlap between threads.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <utility>

#include "sdalloc/core/stream.hpp"

namespace sdalloc::conformance {

// The bytes written at each end and in the middle of an allocation.
inline constexpr std::size_t kPatternSpan = 64;

struct LiveAllocation {
  std::size_t size = 0;
  Stream stream;
  unsigned char pattern = 0;
};

// Sums over the live allocations, compared with what a resource reports about itself.
struct LiveTotals {
  std::size_t bytes = 0;
  std::size_t count = 0;
  // Sizes rounded up to 512 bytes (CachingPool's rounding): the least a pool's blocks for
  // these allocations can add up to.
  std::size_t rounded_bytes = 0;
};

inline constexpr std::size_t kPoolRounding = 512;

inline std::size_t rounded_to_pool_blocks(std::size_t size) {
  return (size + kPoolRounding - 1) / kPoolRounding * kPoolRounding;
}

// Writes `pattern` over the checked ranges of [ptr, ptr + size).
inline void write_pattern(void* ptr, std::size_t size, unsigned char pattern) {
  auto* bytes = static_cast<unsigned char*>(ptr);
  if (size <= 3 * kPatternSpan) {
    std::memset(bytes, pattern, size);
    return;
  }
  std::memset(bytes, pattern, kPatternSpan);
  std::memset(bytes + size / 2 - kPatternSpan / 2, pattern, kPatternSpan);
  std::memset(bytes + size - kPatternSpan, pattern, kPatternSpan);
}

// Success when every checked byte of [ptr, ptr + size) still holds `pattern`.
inline ::testing::AssertionResult pattern_intact(const void* ptr, std::size_t size,
                                                 unsigned char pattern) {
  const auto* bytes = static_cast<const unsigned char*>(ptr);
  auto check = [&](std::size_t begin, std::size_t length) -> std::size_t {
    for (std::size_t i = begin; i < begin + length; ++i) {
      if (bytes[i] != pattern) return i;
    }
    return size;
  };
  std::size_t bad = size;
  if (size <= 3 * kPatternSpan) {
    bad = check(0, size);
  } else {
    bad = check(0, kPatternSpan);
    if (bad == size) bad = check(size / 2 - kPatternSpan / 2, kPatternSpan);
    if (bad == size) bad = check(size - kPatternSpan, kPatternSpan);
  }
  if (bad == size) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "allocation " << ptr << " of " << size << " bytes: byte " << bad << " is "
         << static_cast<int>(bytes[bad]) << ", expected pattern " << static_cast<int>(pattern)
         << " (memory overwritten by another allocation or handed out twice)";
}

class ReferenceModel {
 public:
  // `seed` only varies the pattern bytes between models, so that two threads' allocations
  // that overlap are unlikely to carry the same pattern.
  explicit ReferenceModel(std::size_t alignment = 256, unsigned seed = 0)
      : alignment_(alignment), next_pattern_(seed % 251) {}

  // Checks a fresh result (not null, aligned, overlapping no live allocation), writes its
  // pattern and records it.
  ::testing::AssertionResult add(void* ptr, std::size_t size, Stream stream = {}) {
    if (ptr == nullptr) {
      return ::testing::AssertionFailure() << "allocate(" << size << ") returned nullptr";
    }
    const auto address = reinterpret_cast<std::uintptr_t>(ptr);
    if (address % alignment_ != 0) {
      return ::testing::AssertionFailure()
             << "allocate(" << size << ") returned " << ptr << ", not aligned to " << alignment_;
    }
    if (auto overlap = overlapping(address, size); !overlap) return overlap;
    LiveAllocation entry{size, stream, next_pattern()};
    write_pattern(ptr, size, entry.pattern);
    live_.emplace(address, entry);
    count_in(size);
    return ::testing::AssertionSuccess();
  }

  // Records an allocation another model made (and already patterned): for merging.
  ::testing::AssertionResult adopt(std::uintptr_t address, const LiveAllocation& entry) {
    if (auto overlap = overlapping(address, entry.size); !overlap) return overlap;
    live_.emplace(address, entry);
    count_in(entry.size);
    return ::testing::AssertionSuccess();
  }

  // Checks the pattern of a live allocation and forgets it; the caller then frees it.
  ::testing::AssertionResult remove(void* ptr) {
    auto it = live_.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == live_.end()) {
      return ::testing::AssertionFailure() << ptr << " is not live in the model";
    }
    auto intact = pattern_intact(ptr, it->second.size, it->second.pattern);
    totals_.bytes -= it->second.size;
    totals_.rounded_bytes -= rounded_to_pool_blocks(it->second.size);
    --totals_.count;
    live_.erase(it);
    return intact;
  }

  ::testing::AssertionResult check_all_patterns() const {
    for (const auto& [address, entry] : live_) {
      auto intact =
          pattern_intact(reinterpret_cast<const void*>(address), entry.size, entry.pattern);
      if (!intact) return intact;
    }
    return ::testing::AssertionSuccess();
  }

  // A live allocation chosen uniformly at random: (pointer, its record).
  std::pair<void*, LiveAllocation> pick(std::mt19937_64& rng) const {
    std::uniform_int_distribution<std::size_t> index(0, live_.size() - 1);
    auto it = std::next(live_.begin(), static_cast<std::ptrdiff_t>(index(rng)));
    return {reinterpret_cast<void*>(it->first), it->second};
  }

  bool empty() const { return live_.empty(); }
  const LiveTotals& totals() const { return totals_; }
  const std::map<std::uintptr_t, LiveAllocation>& live() const { return live_; }

 private:
  ::testing::AssertionResult overlapping(std::uintptr_t address, std::size_t size) const {
    // The only candidates are the nearest live allocation at or below `address` and the
    // first one above it.
    auto above = live_.lower_bound(address);
    if (above != live_.end() && above->first < address + size) {
      return ::testing::AssertionFailure()
             << "new allocation [" << reinterpret_cast<void*>(address) << ", +" << size
             << ") overlaps live allocation [" << reinterpret_cast<void*>(above->first) << ", +"
             << above->second.size << ")";
    }
    if (above != live_.begin()) {
      auto below = std::prev(above);
      if (below->first + below->second.size > address) {
        return ::testing::AssertionFailure()
               << "new allocation [" << reinterpret_cast<void*>(address) << ", +" << size
               << ") overlaps live allocation [" << reinterpret_cast<void*>(below->first) << ", +"
               << below->second.size << ")";
      }
    }
    return ::testing::AssertionSuccess();
  }

  void count_in(std::size_t size) {
    totals_.bytes += size;
    totals_.rounded_bytes += rounded_to_pool_blocks(size);
    ++totals_.count;
  }

  unsigned char next_pattern() {
    next_pattern_ = (next_pattern_ + 1) % 251;
    return static_cast<unsigned char>(next_pattern_ + 1);  // 1..251, never 0
  }

  std::size_t alignment_;
  unsigned next_pattern_;
  std::map<std::uintptr_t, LiveAllocation> live_;
  LiveTotals totals_;
};

// Sizes spread evenly over orders of magnitude, from 1 byte to `max_bytes`: tensors of a
// network range from a few bytes (scalars) to hundreds of MiB (activations).
class LogUniformSize {
 public:
  explicit LogUniformSize(std::size_t max_bytes)
      : exponent_(0.0, std::log2(static_cast<double>(max_bytes))) {}
  std::size_t operator()(std::mt19937_64& rng) {
    return static_cast<std::size_t>(std::exp2(exponent_(rng)));
  }

 private:
  std::uniform_real_distribution<double> exponent_;
};

}  // namespace sdalloc::conformance
