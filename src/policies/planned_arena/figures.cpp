// policies/planned_arena/figures.cpp - PlannedArena's stats: the pool's, the recording
// blocks' and the arenas' figures added up.
#include "policies/planned_arena/figures.hpp"

#include <algorithm>

namespace sdalloc::planned_arena_detail {

PoolStats combine_stats(PoolStats pool, const RecordingBlockFigures& recording,
                        const ArenaFigures& arenas, std::size_t peak_held_bytes) {
  PoolStats s = pool;
  s.live_bytes += arenas.live_bytes + recording.live_bytes;
  s.peak_live_bytes += recording.peak_live_bytes;
  s.allocated_bytes += recording.live_rounded_bytes;
  s.peak_allocated_bytes += recording.peak_live_rounded_bytes;
  s.reserved_bytes += recording.held_bytes;
  s.peak_reserved_bytes += recording.peak_held_bytes;
  s.live_allocations += recording.live_blocks;
  s.peak_live_allocations += recording.peak_live_blocks;
  s.allocations += recording.allocations;
  s.frees += recording.frees;
  s.segments += recording.blocks;
  s.peak_segments += recording.peak_blocks;
  s.segment_allocations += recording.upstream_allocations;
  s.segment_releases += recording.upstream_releases;
  s.failed_releases += recording.failed_releases;

  s.peak_live_bytes += arenas.peak_live_bytes;
  s.allocated_bytes += arenas.allocated_bytes;
  s.peak_allocated_bytes += arenas.peak_allocated_bytes;
  s.reserved_bytes += arenas.reserved_bytes;
  // Measured under all three sources (figures.hpp), never below what is reserved now.
  s.peak_reserved_bytes = std::max(peak_held_bytes, s.reserved_bytes);
  s.live_allocations += arenas.live_allocations;
  s.peak_live_allocations += arenas.peak_live_allocations;
  s.allocations += arenas.allocations;
  s.frees += arenas.frees;
  s.segments += arenas.arenas;
  s.peak_segments += arenas.peak_arenas;
  s.segment_allocations += arenas.reservations;
  s.segment_releases += arenas.releases;
  s.failed_releases += arenas.failed_releases;
  s.free_bytes = s.reserved_bytes - s.allocated_bytes;
  return s;
}

}  // namespace sdalloc::planned_arena_detail
