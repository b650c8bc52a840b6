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

using caching_detail::caching_shard;
using caching_detail::CachingShard;
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
  CachingShard& shard = caching_shard(shard_for(stream));
  bool due = false;
  {
    std::lock_guard lock(shard.mutex);
    // Blocks freed on other streams rejoin the cache as soon as their events complete:
    // polled here (never waited for), one query per pending block, nothing when none is
    // pending. Otherwise a pool whose cache keeps hitting would hold them, and their
    // events, until its next miss.
    if (!shard.pending.empty()) shard.collect_pending(events, /*wait=*/false);
    due = shard.due;
    if (!due) {
      if (Block* block = shard.allocate(fit, bytes)) return block->ptr();
    }
  }
  if (due) {
    consolidate(shard);
    if (void* ptr = allocate_in(shard, fit, bytes)) return ptr;
  }
  return allocate_slow(shard, fit, bytes);
}

void CachingPool::Impl::free(void* ptr, Stream stream, const std::size_t* expected_bytes) {
  if (ptr == nullptr) return;
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  CachingShard& shard = caching_shard(shard_for(stream));
  {
    std::lock_guard lock(shard.mutex);
    Block* block = shard.find_live(addr);
    if (block != nullptr && block->other_streams == nullptr) {
      check_size(block, ptr, expected_bytes);
      shard.forget_live(block);
      shard.release(block);
      note_free(shard);
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

void* CachingPool::Impl::allocate_slow(CachingShard& shard, const Fit& fit, std::size_t bytes) {
  // 1. Blocks freed on other streams whose work has completed since.
  {
    std::lock_guard lock(shard.mutex);
    if (!shard.pending.empty() && shard.collect_pending(events, false)) {
      if (Block* block = shard.allocate(fit, bytes)) return block->ptr();
    }
  }
  // 2. A wholly free segment cached by another, idle stream.
  if (void* ptr = allocate_from_other_shards(shard, fit, bytes, /*wait=*/false)) return ptr;
  // 3. A new segment from the resource, the cache released first if the pool would grow
  // past its peak.
  const std::size_t rounded = round_up(fit.needed, options.segment_granularity);
  const std::size_t segment_size = std::max(rounded, options.min_segment_size);
  // A huge request below the smallest segment shares it like any other.
  const bool huge = fit.huge && rounded >= options.min_segment_size;
  release_to_grow(shard, segment_size);
  void* base = nullptr;
  try {
    base = upstream.allocate(segment_size, shard.stream);
  } catch (const OutOfMemory&) {
    // 4. Out of memory: wait for pending frees and busy streams, return every cached
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

void CachingPool::Impl::release_to_grow(CachingShard& shard, std::size_t growth) {
  if (!options.release_cached_before_growth ||
      counters.reserved_bytes.current() + growth <= counters.reserved_bytes.high()) {
    return;
  }
  std::size_t own = 0;
  release_free_segments(&shard, /*wait=*/false, &own);
  if (own == 0) return;
  // Memory went back only to be asked for again: see consolidate().
  std::lock_guard lock(shard.mutex);
  note_churn(shard);
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
