// layout_checks.hpp - what every pool's layout() must satisfy, checked against its stats().
//
// Segments in address order; the blocks of a segment tile it exactly, without gaps; free and
// pending blocks request nothing; the segments add up to the reserved bytes (less a
// VirtualMemoryPool's spare chunks, mapped nowhere), the live blocks to the allocated bytes
// and their requests to the live bytes. Call it at a quiescent moment (no other thread
// allocating), for any pool with layout() and stats(). Answers the number of live blocks.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>

#include "sdalloc/core/pool_layout.hpp"
#include "sdalloc/core/pool_stats.hpp"

namespace sdalloc::test {

template <typename Pool>
std::size_t expect_layout_matches_stats(const Pool& pool) {
  const PoolLayout layout = pool.layout();
  const PoolStats stats = pool.stats();
  std::size_t reserved = 0, allocated = 0, requested = 0, live = 0;
  for (std::size_t i = 0; i < layout.segments.size(); ++i) {
    const SegmentLayout& s = layout.segments[i];
    if (i > 0) {
      EXPECT_LT(layout.segments[i - 1].address, s.address) << "address order";
    }
    std::uintptr_t at = s.address;
    for (const BlockLayout& b : s.blocks) {
      EXPECT_EQ(b.address, at) << "blocks tile the segment without gaps";
      at += b.size;
      if (b.state == BlockState::kLive) {
        allocated += b.size;
        requested += b.requested;
        ++live;
      } else {
        EXPECT_EQ(b.requested, 0u);
      }
    }
    EXPECT_EQ(at, s.address + s.size) << "blocks cover the segment";
    reserved += s.size;
  }
  EXPECT_EQ(reserved, stats.reserved_bytes - stats.spare_bytes);
  EXPECT_EQ(allocated, stats.allocated_bytes);
  EXPECT_EQ(requested, stats.live_bytes);
  return live;
}

}  // namespace sdalloc::test
