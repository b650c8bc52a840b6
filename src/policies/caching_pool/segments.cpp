// segments.cpp - CachingPool's segments: installing, releasing, returning, consolidating.
//
// A segment is one range from the upstream resource, in exactly one shard's list. It goes
// back to the resource only when wholly free and unpinned, on the stream that last used it
// (the resource orders the release after that stream's work). Each function here takes one
// shard lock at a time and makes its system calls outside every lock.

#include <algorithm>
#include <mutex>
#include <new>
#include <vector>

#include "policies/caching_pool/caching_pool_impl.hpp"

namespace sdalloc {

using caching_detail::CachingShard;
using detail::Block;
using detail::PoolShard;
using detail::Segment;

// =======================================================================================
// install, release, return

Block* CachingPool::Impl::install_segment(PoolShard& shard, void* base, std::size_t size, bool huge,
                                          bool pinned) {
  Segment* segment = nullptr;
  try {
    segment = new Segment{};
    segment->base = reinterpret_cast<std::uintptr_t>(base);
    segment->size = size;
    segment->huge = huge;
    segment->pinned = pinned;
    Block* block = shard.add_segment(segment);  // from here the shard's list owns it
    counters.reserved_bytes.add(size);
    counters.segments.add(1);
    counters.segment_allocations.fetch_add(1, std::memory_order_relaxed);
    return block;
  } catch (...) {
    delete segment;  // add_segment fails only before it links the segment
    give_back(base, size, shard.stream);
    throw;
  }
}

std::size_t CachingPool::Impl::release_free_segments(const PoolShard* requester, bool wait,
                                                     std::size_t* own) {
  std::size_t released = 0;
  for (PoolShard* shard : shards()) {
    std::vector<Segment*> segments;
    {
      std::lock_guard lock(shard->mutex);
      if (wait && !shard->pending.empty()) shard->collect_pending(events, true);
      if (!wait && shard != requester && !events.idle(shard->stream)) continue;
      segments = shard->releasable_segments();
      for (Segment* s : segments) {
        shard->remove_segment(s, /*keep_block=*/false);
        counters.reserved_bytes.sub(s->size);
        counters.segments.sub(1);
      }
    }
    const std::size_t bytes = return_segments(segments, shard->stream);
    if (own != nullptr && shard == requester) *own += bytes;
    released += bytes;
  }
  return released;
}

std::size_t CachingPool::Impl::return_segments(const std::vector<Segment*>& segments,
                                               Stream stream) {
  std::size_t released = 0;
  for (Segment* s : segments) {
    if (give_back(reinterpret_cast<void*>(s->base), s->size, stream)) released += s->size;
    delete s;
  }
  return released;
}

void CachingPool::Impl::destroy_segment(PoolShard& shard, Segment* segment) noexcept {
  give_back(reinterpret_cast<void*>(segment->base), segment->size, shard.stream);
  delete segment;
}

// A segment leaves the pool's books before it goes back, so a resource whose deallocate
// fails cannot make the pool inconsistent: the range is left to the resource (leaked from
// the pool's view, counted in failed_releases) and the caller's request, which already
// succeeded, does not fail for it.
bool CachingPool::Impl::give_back(void* base, std::size_t size, Stream stream) noexcept {
  try {
    upstream.deallocate(base, size, stream);
    counters.segment_releases.fetch_add(1, std::memory_order_relaxed);
    return true;
  } catch (...) {
    counters.failed_releases.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
}

void CachingPool::Impl::reserve_initial() {
  if (options.initial_reservation == 0) return;
  PoolShard& shard = shard_for(kDefaultStream);
  void* base = upstream.allocate(options.initial_reservation, shard.stream);
  std::lock_guard lock(shard.mutex);
  install_segment(shard, base, options.initial_reservation, /*huge=*/false, /*pinned=*/true);
}

// =======================================================================================
// consolidation
//
// Separate segments cannot merge. A pool that keeps its footprint low by releasing free
// segments before it grows then asks for the same memory again in every iteration of a
// loop. Once the work of a stream that so churned has gone through a repeated step
// (note_free in caching_pool_impl.hpp), its wholly free segments are swapped for one arena:
// the next step runs in it, beside the segments of the blocks that stayed live, where best
// fit packs it without growing or releasing. An arena holds the work's peak of allocated
// bytes and 1/kArenaHeadroom of it for best fit's waste; where the same work (no new peak)
// needed segments beside its arena and churned again, the next arena also holds what the
// last one and those segments held at their peak, so a loop settles instead of churning for
// good.

void CachingPool::Impl::consolidate(CachingShard& shard) {
  std::vector<Segment*> segments;
  std::size_t target = 0;
  {
    std::lock_guard lock(shard.mutex);
    if (!shard.due) return;  // another thread got there first
    shard.due = false;
    if (!shard.pending.empty()) return;  // blocks still wait for other streams' work
    shard.churned = false;
    detail::ShardFigures& f = shard.figures;
    segments = shard.releasable_segments();
    std::size_t staying = f.reserved_bytes;
    for (const Segment* s : segments) staying -= s->size;
    std::size_t needed =
        f.high_allocated_bytes + (f.high_allocated_bytes - f.allocated_bytes) / kArenaHeadroom;
    if (shard.arena_work == f.high_allocated_bytes) {
      needed = std::max(needed, f.peak_reserved_since_mark);
    }
    target = needed > staying ? round_up(needed - staying, options.segment_granularity) : 0;
    shard.arena_work = f.high_allocated_bytes;
    f.peak_reserved_since_mark = f.reserved_bytes;
    // One free segment is worth swapping only for a larger one (or for an ordinary one,
    // where it is a huge request's): it is the arena.
    if (segments.empty() ||
        (segments.size() == 1 && !segments[0]->huge && segments[0]->size >= target)) {
      return;
    }
    for (Segment* s : segments) {
      shard.remove_segment(s, /*keep_block=*/false);
      counters.reserved_bytes.sub(s->size);
      counters.segments.sub(1);
    }
    f.peak_reserved_since_mark = f.reserved_bytes;
  }
  return_segments(segments, shard.stream);
  if (target == 0) return;
  void* base = nullptr;
  try {
    base = upstream.allocate(target, shard.stream);
  } catch (const Error&) {
    return;  // an optimisation only: the pool simply holds less now
  }
  if (base == nullptr) return;
  std::lock_guard lock(shard.mutex);
  install_segment(shard, base, target, /*huge=*/false, /*pinned=*/false);
  counters.consolidations.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace sdalloc
