// fast_path.cpp - CachingPool's allocate and free, and the slow path of allocate.
//
// Fast path (allocate and free of a cached size): find the stream's shard in the published
// shard table (no lock), take that shard's lock, pop its quick list or best-fit in its
// index, carve, count. Everything that can make a system call or touch another shard is in
// the slow path below it, which never holds two shard locks at once. The public entry points
// that lead here are defined in this file too, so the fast path inlines into them.

#include <algorithm>
#include <mutex>

#include "policies/caching_pool/caching_pool_impl.hpp"

namespace sdalloc {

using detail::Block;
using detail::Fit;
using detail::PoolShard;
using detail::Segment;

// =======================================================================================
// the fast path

void* CachingPool::Impl::allocate(std::size_t bytes, std::size_t alignment, Stream stream) {
  check_request(bytes, alignment);
  if (bytes == 0) return nullptr;
  const Fit fit = fit_for(bytes, alignment);
  PoolShard& shard = shard_for(stream);
  bool consolidation_due = false;
  {
    std::lock_guard lock(shard.mutex);
    // Blocks freed on other streams rejoin the cache as soon as their events complete:
    // polled here (never waited for), one query per pending block, nothing when none is
    // pending. Otherwise a pool whose cache keeps hitting would hold them, and their
    // events, until its next miss.
    if (!shard.pending.empty()) shard.collect_pending(events, /*wait=*/false);
    consolidation_due = shard.consolidation_due;
    if (!consolidation_due) {
      if (Block* block = shard.allocate(fit, bytes)) return block->ptr();
    }
  }
  if (consolidation_due) {
    consolidate(shard);
    if (void* ptr = allocate_in(shard, fit, bytes)) return ptr;
  }
  return allocate_slow(shard, fit, bytes);
}

void CachingPool::Impl::free(void* ptr, Stream stream, const std::size_t* expected_bytes) {
  if (ptr == nullptr) return;
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  PoolShard& shard = shard_for(stream);
  {
    std::lock_guard lock(shard.mutex);
    Block* block = shard.find_live(addr);
    if (block != nullptr && block->other_streams == nullptr) {
      check_size(block, ptr, expected_bytes);
      shard.forget_live(block);
      shard.release(block);
      note_low(shard);
      return;
    }
  }
  free_slow(ptr, stream, expected_bytes);
}

void* CachingPool::do_allocate(std::size_t bytes, Stream stream) {
  return impl_->allocate(bytes, kRounding, stream);
}

void* CachingPool::allocate(std::size_t bytes, std::size_t alignment, Stream stream) {
  return impl_->allocate(bytes, alignment, stream);
}

void CachingPool::do_deallocate(void* ptr, std::size_t bytes, Stream stream) {
  impl_->free(ptr, stream, &bytes);
}

void CachingPool::free(void* ptr, Stream stream) { impl_->free(ptr, stream, nullptr); }

// =======================================================================================
// the slow path of allocate

void* CachingPool::Impl::allocate_in(PoolShard& shard, const Fit& fit, std::size_t bytes) {
  std::lock_guard lock(shard.mutex);
  Block* block = shard.allocate(fit, bytes);
  return block != nullptr ? block->ptr() : nullptr;
}

void* CachingPool::Impl::allocate_slow(PoolShard& shard, const Fit& fit, std::size_t bytes) {
  // 1. Blocks freed on other streams whose work has completed since.
  {
    std::lock_guard lock(shard.mutex);
    if (!shard.pending.empty() && shard.collect_pending(events, false)) {
      if (Block* block = shard.allocate(fit, bytes)) return block->ptr();
    }
  }
  // 2. A wholly free segment cached by another, idle stream.
  if (void* ptr = allocate_from_other_shards(shard, fit, bytes, /*wait=*/false)) return ptr;
  // 3. The shard's arena, grown in place where the resource can.
  bool stitch = false;
  if (void* ptr = grow_arena(shard, fit, bytes, stitch)) return ptr;
  // 4. A new segment from the resource.
  std::size_t grain = segment_grain(counters.reserved_bytes.high() + fit.needed);
  if (fit.huge) grain = huge_grain(fit.needed, grain);
  std::size_t segment_size = round_up(fit.needed, grain);
  const bool huge = fit.huge && segment_size >= options.min_segment_size;
  if (grain == options.segment_granularity) {
    segment_size = std::max(segment_size, options.min_segment_size);
  }
  note_fragmented_growth(shard, fit, segment_size);
  // The shard's own free segments go back in exchange for the new one (their pages move
  // into it where the resource can: see exchange_segments and pages_for).
  // Where stitching, the arenas' free runs are among them.
  std::vector<Segment*> released = release_to_grow(shard, segment_size, stitch);
  // Spare pages of earlier releases come first; what the new segment does not need of
  // the segments just released is kept for later (pages_for).
  released = pages_for(shard, std::move(released), segment_size);
  void* base = nullptr;
  try {
    base = exchange_segments(released, segment_size, shard.stream);
  } catch (const OutOfMemory&) {
    // 5. Out of memory: wait for pending frees and busy streams, return every cached
    // segment, and retry once.
    oom_retries().fetch_add(1, std::memory_order_relaxed);
    release_free_segments(&shard, /*wait=*/true);
    if (void* ptr = allocate_in(shard, fit, bytes)) return ptr;
    if (void* ptr = allocate_from_other_shards(shard, fit, bytes, /*wait=*/true)) return ptr;
    try {
      base = upstream.allocate(segment_size, shard.stream);
    } catch (const OutOfMemory& refusal) {
      ooms().fetch_add(1, std::memory_order_relaxed);
      throw OutOfMemory::describe(name(), oom_info(bytes),
                                  "a new segment of " + format_bytes(segment_size) +
                                      " was refused after releasing the cache: " + refusal.what());
    }
  }
  if (base == nullptr) {
    throw Error(name() + ": upstream resource returned null for " + format_bytes(segment_size));
  }
  std::lock_guard lock(shard.mutex);
  Block* block = install_segment(shard, base, segment_size, huge, /*pinned=*/false);
  // The fresh segment fits by construction; take it directly so no other block wins.
  return shard.allocate_from(block, fit, bytes)->ptr();
}

std::vector<Segment*> CachingPool::Impl::release_to_grow(PoolShard& shard, std::size_t growth,
                                                         bool stitch) {
  std::vector<Segment*> released;
  if (!options.release_cached_before_growth ||
      counters.reserved_bytes.current() + growth <= counters.reserved_bytes.high()) {
    return released;
  }
  const std::size_t bytes = release_free_segments(&shard, /*wait=*/false, &released);
  if (bytes < growth) cut_free_ends(shard, growth - bytes, released, stitch);
  // A release of less than 1/kChurnShare of the growth is no churn: the 128 KiB segment
  // of a first small tensor, freed before the work's first large one, marked an ONNX
  // Runtime session churned, and its arena then took the size of its fragmented segments
  // for good (1.432 x the runs' live peak in every run; 1.080 x from the second run so).
  if (bytes == 0 || bytes < growth / kChurnShare) return released;
  std::lock_guard lock(shard.mutex);
  // Memory went back only to be asked for again: see consolidate(). The lows are
  // counted from the first churn: a mark of fragmentation before it may have come at the
  // first allocation (the slack of a segment for a 1 KiB bias is "fragmented"), and a low
  // counted from there is one no floor of weights ever reaches again.
  note_churn_low(shard, /*kept=*/shard.churned);
  shard.churned = true;
  shard.churned_since_floor = true;
  return released;
}

void CachingPool::Impl::note_fragmented_growth(PoolShard& shard, const Fit& fit,
                                               std::size_t segment_size) {
  if (!options.release_cached_before_growth) return;  // it keeps what it took, by request
  std::lock_guard lock(shard.mutex);
  if (shard.fragmented) return;
  const std::size_t free_after = shard.free_bytes() + (segment_size - fit.needed);
  const std::size_t allocated_after = shard.figures.allocated_bytes + fit.needed;
  if (free_after <= allocated_after / kFragmentedShare) return;
  for (const Segment* s = shard.segments; s != nullptr; s = s->next) {
    if (s->arena) return;  // an arena that overflows is not made again at the same size
  }
  note_churn_low(shard, /*kept=*/shard.churned);
  shard.fragmented = true;
}

void* CachingPool::Impl::allocate_from_other_shards(PoolShard& shard, const Fit& fit,
                                                    std::size_t bytes, bool wait) {
  for (PoolShard* other : shards()) {
    if (other == &shard) continue;
    Segment* segment = nullptr;
    {
      std::lock_guard lock(other->mutex);
      segment = other->find_free_segment(fit);
      if (segment == nullptr) continue;
      if (!segment->used) {
        // Never handed out (the initial reservation): no stream's work can touch it.
      } else if (wait) {
        const StreamEvents::Event done = events.record(other->stream);
        events.synchronize(done);
        events.release(done);
      } else if (!events.idle(other->stream)) {
        continue;
      }
      other->remove_segment(segment, /*keep_block=*/true);
    }
    std::lock_guard lock(shard.mutex);
    shard.adopt(segment, segment->first);
    if (Block* block = shard.allocate(fit, bytes)) return block->ptr();
  }
  return nullptr;
}

}  // namespace sdalloc
