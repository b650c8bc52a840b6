// policies/planned_arena/figures.cpp - PlannedArena's stats: the pool's, the recording
// blocks' and the arenas' figures added up.
#include "policies/planned_arena/figures.hpp"

#include <algorithm>

namespace sdalloc::planned_arena_detail {

namespace {
void raise(std::atomic<std::size_t>& peak, std::size_t value) {
  std::size_t seen = peak.load(std::memory_order_relaxed);
  while (value > seen && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}
}  // namespace

void LiveGauge::add(std::size_t bytes, std::size_t rounded) {
  raise(peak_live_, live_.fetch_add(bytes, std::memory_order_relaxed) + bytes);
  raise(peak_allocated_, allocated_.fetch_add(rounded, std::memory_order_relaxed) + rounded);
  raise(peak_count_, count_.fetch_add(1, std::memory_order_relaxed) + 1);
}

void LiveGauge::sub(std::size_t bytes, std::size_t rounded) {
  live_.fetch_sub(bytes, std::memory_order_relaxed);
  allocated_.fetch_sub(rounded, std::memory_order_relaxed);
  count_.fetch_sub(1, std::memory_order_relaxed);
}

void LiveGauge::reset_peak() {
  peak_live_.store(live_.load(std::memory_order_relaxed), std::memory_order_relaxed);
  peak_allocated_.store(allocated_.load(std::memory_order_relaxed), std::memory_order_relaxed);
  peak_count_.store(count_.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

PoolStats combine_stats(PoolStats pool, const RecordingBlockFigures& recording,
                        const ArenaFigures& arenas, const ResourceStats& held,
                        const LiveGauge& live, bool arenas_in_pool) {
  PoolStats s = pool;
  if (arenas_in_pool) {
    // The pool counts each arena as one live allocation of reserved_bytes; the arenas'
    // buffers are what is live there.
    s.live_bytes -= arenas.reserved_bytes;
    s.allocated_bytes -= std::min(s.allocated_bytes, arenas.reserved_bytes);
    s.live_allocations -= arenas.arenas;
    s.allocations -= arenas.reservations;
    s.frees -= arenas.releases;
  }
  s.live_bytes += arenas.live_bytes + recording.live_bytes;
  s.allocated_bytes += recording.live_rounded_bytes;
  s.reserved_bytes += recording.held_bytes;
  s.live_allocations += recording.live_blocks;
  s.allocations += recording.allocations;
  s.frees += recording.frees;
  s.segments += recording.blocks;
  s.segment_allocations += recording.upstream_allocations;
  s.segment_releases += recording.upstream_releases;
  s.failed_releases += recording.failed_releases;

  s.allocated_bytes += arenas.allocated_bytes;
  if (!arenas_in_pool) s.reserved_bytes += arenas.reserved_bytes;
  // Measured under all three sources (figures.hpp), or by a pool that takes its memory
  // elsewhere (pages of a VirtualMemory); never below what is reserved now.
  s.peak_reserved_bytes = std::max({held.peak_bytes, pool.peak_reserved_bytes, s.reserved_bytes});
  s.live_allocations += arenas.live_allocations;
  s.allocations += arenas.allocations;
  s.frees += arenas.frees;
  if (!arenas_in_pool) {
    s.segments += arenas.arenas;
    s.segment_allocations += arenas.reservations;
    s.segment_releases += arenas.releases;
  }
  // Ranges held at once, counted in the same place; never below what is held now.
  s.peak_segments = std::max({held.peak_count, pool.peak_segments, s.segments});
  s.failed_releases += arenas.failed_releases;
  // Measured at PlannedArena's allocate and free (LiveGauge), never below the current sums.
  s.peak_live_bytes = std::max(live.peak_live_bytes(), s.live_bytes);
  s.peak_allocated_bytes = std::max(live.peak_allocated_bytes(), s.allocated_bytes);
  s.peak_live_allocations = std::max(live.peak_allocations(), s.live_allocations);
  s.free_bytes = s.reserved_bytes - s.allocated_bytes;
  return s;
}

}  // namespace sdalloc::planned_arena_detail
