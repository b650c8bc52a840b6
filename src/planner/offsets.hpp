// planner/offsets.hpp - offset arithmetic of the planner, checked: offsets and sizes are
// 64-bit and come from the user, so offset + size and rounding up may not fit. Internal.
//
// end_of() and align_up() throw InvalidArgument where the exact result would pass 2^64 - 1
// (a wrapped sum would make overlapping buffers look disjoint); saturating_add() is for
// bounds that only need to compare against a capacity.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "sdalloc/core/errors.hpp"

namespace sdalloc::planner_detail {

inline constexpr std::uint64_t kNoOffset = std::numeric_limits<std::uint64_t>::max();

// offset + size; throws when it passes 2^64 - 1.
inline std::uint64_t end_of(std::uint64_t offset, std::uint64_t size) {
  std::uint64_t end = 0;
  if (__builtin_add_overflow(offset, size, &end)) {
    throw InvalidArgument("offset " + std::to_string(offset) + " + size " + std::to_string(size) +
                          " passes 2^64 - 1: no plan fits in 64-bit offsets");
  }
  return end;
}

// The least multiple of alignment (a power of two) >= value; throws when it passes 2^64 - 1.
inline std::uint64_t align_up(std::uint64_t value, std::uint64_t alignment) {
  return end_of(value, alignment - 1) & ~(alignment - 1);
}

// align_up that gives 2^64 - 1 (above any capacity) instead of throwing.
inline std::uint64_t align_up_saturating(std::uint64_t value, std::uint64_t alignment) {
  std::uint64_t sum = 0;
  if (__builtin_add_overflow(value, alignment - 1, &sum)) return kNoOffset;
  return sum & ~(alignment - 1);
}

inline std::uint64_t saturating_add(std::uint64_t a, std::uint64_t b) {
  std::uint64_t sum = 0;
  return __builtin_add_overflow(a, b, &sum) ? std::numeric_limits<std::uint64_t>::max() : sum;
}

inline std::uint64_t saturating_mul(std::uint64_t a, std::uint64_t b) {
  std::uint64_t product = 0;
  return __builtin_mul_overflow(a, b, &product) ? std::numeric_limits<std::uint64_t>::max()
                                                : product;
}

// upper - lower for upper > lower, exact for any two int64 (the difference fits a uint64).
inline std::uint64_t lifetime_of(std::int64_t lower, std::int64_t upper) {
  return static_cast<std::uint64_t>(upper) - static_cast<std::uint64_t>(lower);
}

}  // namespace sdalloc::planner_detail
