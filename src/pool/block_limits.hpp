// block_limits.hpp - the sizes every pool block obeys (internal).
//
// Blocks of the stream-ordered pools (CachingPool, VirtualMemoryPool) are cut in multiples
// of kBlockRounding, start at least kBlockRounding-aligned, and serve requests of at most
// kMaxBlockAllocation bytes with alignments up to kMaxBlockAlignment. The public constants
// (CachingPool::kRounding, VirtualMemoryPool::kRounding, ...) are static_asserted equal to
// these where each pool is defined, so the layers below the policies never include them.
#pragma once

#include <cstddef>

namespace sdalloc::detail {

inline constexpr std::size_t kBlockRounding = 512;
inline constexpr std::size_t kMaxBlockAlignment = std::size_t{1} << 30;
inline constexpr std::size_t kMaxBlockAllocation = std::size_t{1} << 48;

}  // namespace sdalloc::detail
