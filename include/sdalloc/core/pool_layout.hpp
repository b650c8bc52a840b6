// sdalloc/core/pool_layout.hpp - where a pool's memory is: its segments and the blocks tiling them.
//
// CachingPool::layout() answers one consistent picture of the pool (every shard locked at
// once while it is taken): each segment held from the resource, with the blocks that tile it
// in address order, each block free, live or waiting for another stream's work. It is what
// a memory snapshot needs (the Python package writes it in the layout of PyTorch's
// torch.cuda.memory._snapshot(), so PyTorch's viewers can read sdalloc's pools) and what a
// person debugging fragmentation wants to see.
//
// Invariants of a layout taken from a pool: the blocks of a segment cover it exactly, without
// gaps; the sum of segment sizes is the pool's reserved bytes, the sum of live block sizes
// its allocated bytes and the sum of their requested sizes its live bytes (stats() taken at
// the same quiescent moment agrees).
//
// Cost: walks every block; takes every shard's lock for the walk. For tools and debugging,
// not for a hot path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "sdalloc/core/stream.hpp"

namespace sdalloc {

enum class BlockState : std::uint8_t {
  kFree,         // cached: reusable by the segment's stream now
  kLive,         // handed out and not freed
  kPendingFree,  // freed, but another stream's work may still use it (record_stream)
};

struct BlockLayout {
  std::uintptr_t address = 0;
  std::size_t size = 0;       // the block, after rounding (a multiple of 512)
  std::size_t requested = 0;  // bytes asked for (live blocks); 0 for free and pending ones
  BlockState state = BlockState::kFree;
};

struct SegmentLayout {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  Stream stream;                    // the stream whose shard holds the segment now
  bool huge = false;                // made for one huge request (see caching_pool.hpp)
  bool pinned = false;              // the initial reservation, kept until the pool dies
  std::vector<BlockLayout> blocks;  // address order, tiling [address, address + size)
};

struct PoolLayout {
  std::vector<SegmentLayout> segments;  // by address
};

}  // namespace sdalloc
