// core/bits.hpp - the integer arithmetic of sizes and alignments, written once.
//
// Every pool, resource and the planner round sizes and check alignments; these are the one
// definition of each (internal, not part of the public API). Callers check for overflow
// first where a value can come from a user: round_up(value, multiple) wraps when value is
// within `multiple` of SIZE_MAX.
#pragma once

#include <cstddef>

namespace sdalloc {

// True for 1, 2, 4, 8, ...; false for 0.
constexpr bool is_power_of_two(std::size_t value) {
  return value != 0 && (value & (value - 1)) == 0;
}

// The least multiple of `multiple` (> 0) that is >= value.
constexpr std::size_t round_up(std::size_t value, std::size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

}  // namespace sdalloc
