// block_limits.hpp - the sizes every pool block obeys (internal).
//
// Blocks of the stream-ordered pools (CachingPool, VirtualMemoryPool) are cut in multiples
// of kBlockRounding, start at least kBlockRounding-aligned, and serve requests of at most
// kMaxBlockAllocation bytes with alignments up to kMaxBlockAlignment: the limits every pool
// states (core/pool.hpp's kPoolRounding, ...; CachingPool::kRounding and the others are the
// same numbers), named here for the block code of this layer.
#pragma once

#include <cstddef>

#include "sdalloc/core/pool.hpp"

namespace sdalloc::detail {

inline constexpr std::size_t kBlockRounding = kPoolRounding;
inline constexpr std::size_t kMaxBlockAlignment = kPoolMaxAlignment;
inline constexpr std::size_t kMaxBlockAllocation = kPoolMaxAllocation;

}  // namespace sdalloc::detail
