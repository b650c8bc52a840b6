// policies/planned_arena/figures.hpp - what PlannedArena counts beside its fallback pool,
// and how those figures add up to one PoolStats.
//
// Two sources of memory sit beside the fallback pool: the recording's blocks taken straight
// from the upstream (RecordingBlocks) and the arenas (SharedArena). Each keeps its own
// figures in the struct below - current values, peaks, totals - and combine_stats() adds
// them to the pool's stats. Invariants: a peak is >= its current value from the last
// reset_peak() on; totals only grow. Current figures are exact sums. The byte and
// allocation peaks are what the sources held at once, not the sum of their own peaks (which
// can be twice as much): the reserved peak is measured under the three sources (a
// StatsResource between them and the upstream), as is the peak count of ranges held
// (peak_segments), and the live peaks by LiveGauge at PlannedArena's own allocate and free.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "sdalloc/core/pool_stats.hpp"
#include "sdalloc/resources/stats_resource.hpp"

namespace sdalloc::planned_arena_detail {

struct RecordingBlockFigures {
  // Current.
  std::size_t held_bytes = 0;          // raw bytes from the upstream: live and cached
  std::size_t live_raw_bytes = 0;      // raw bytes of the live blocks
  std::size_t live_rounded_bytes = 0;  // what the live blocks hand out
  std::size_t live_bytes = 0;          // what callers asked for
  std::size_t live_blocks = 0;
  std::size_t blocks = 0;  // live and cached
  // Peak. It bounds the recording's cache (RecordingBlocks), so PlannedArena::reset_peak()
  // leaves it alone.
  std::size_t peak_live_raw_bytes = 0;
  // Totals.
  std::uint64_t allocations = 0;  // requests served
  std::uint64_t frees = 0;
  std::uint64_t upstream_allocations = 0;  // blocks taken from the upstream
  std::uint64_t upstream_releases = 0;
  std::uint64_t failed_releases = 0;  // upstream deallocates that failed: left to it
};

struct ArenaFigures {
  // Current, summed over the current arena and the retired ones.
  std::size_t live_bytes = 0;
  std::size_t allocated_bytes = 0;
  std::size_t reserved_bytes = 0;
  std::size_t live_allocations = 0;
  std::size_t arenas = 0;  // reserved arenas
  // Totals.
  std::uint64_t allocations = 0;
  std::uint64_t frees = 0;
  std::uint64_t reservations = 0;  // arenas taken from the upstream
  std::uint64_t releases = 0;
  std::uint64_t failed_releases = 0;    // upstream deallocates that failed: left to it
  std::uint64_t failures = 0;           // reservations refused (PlannedArenaCounters)
  std::uint64_t prefault_failures = 0;  // arenas whose pages could not be faulted in
};

// What the three sources have live at once: every allocation PlannedArena hands out and
// every free it takes, whichever source serves it. `allocated` counts the requests rounded
// to the 512-byte block (what the arenas and the recording count; the fallback pool counts
// its blocks, which can be larger, so the combined peak is taken as at least the current
// sum). Atomic: the fallback pool's path takes no lock of PlannedArena's.
class LiveGauge {
 public:
  void add(std::size_t bytes, std::size_t rounded);
  void sub(std::size_t bytes, std::size_t rounded);
  void reset_peak();  // the peaks become the current values
  std::size_t peak_live_bytes() const { return peak_live_.load(std::memory_order_relaxed); }
  std::size_t peak_allocated_bytes() const {
    return peak_allocated_.load(std::memory_order_relaxed);
  }
  std::size_t peak_allocations() const { return peak_count_.load(std::memory_order_relaxed); }

 private:
  std::atomic<std::size_t> live_{0}, allocated_{0}, count_{0};
  std::atomic<std::size_t> peak_live_{0}, peak_allocated_{0}, peak_count_{0};
};

// The fallback pool's stats with both other sources added; the reserved and segment peaks
// from `held` (the StatsResource under all three) or the pool's, whichever is more, the live
// peaks from `live`. arenas_in_pool: the arenas are allocations of the pool
// (PlannedArenaOptions::arena_from_fallback), already in its reserved bytes and segments,
// and counted there as live blocks: the arenas' own live buffers replace them.
PoolStats combine_stats(PoolStats pool, const RecordingBlockFigures& recording,
                        const ArenaFigures& arenas, const ResourceStats& held,
                        const LiveGauge& live, bool arenas_in_pool = false);

}  // namespace sdalloc::planned_arena_detail
