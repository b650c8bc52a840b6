// caching_pool.cpp - CachingPool: its options, the core's hooks, figures, and the facade.
//
// The pool is the stream-ordered core (src/pool/stream_ordered_core.hpp) over segments of an
// upstream resource; caching_pool_impl.hpp says which file holds which part. Figures here
// take each shard's lock in turn (stats) or all of them in table order (check_invariants,
// layout), never while a slow path holds one.

#include "sdalloc/policies/caching_pool.hpp"

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "policies/caching_pool/caching_pool_impl.hpp"

namespace sdalloc {

using detail::Block;
using detail::PoolShard;
using detail::Segment;

void CachingPoolOptions::validate() const {
  auto fail = [](const std::string& what) { throw InvalidArgument("CachingPoolOptions: " + what); };
  if (!is_power_of_two(segment_granularity) || segment_granularity < 4096) {
    fail("segment_granularity must be a power of two of at least 4096, got " +
         std::to_string(segment_granularity));
  }
  if (min_segment_size == 0 || min_segment_size % segment_granularity != 0) {
    fail("min_segment_size must be a positive multiple of segment_granularity, got " +
         std::to_string(min_segment_size));
  }
  if (initial_reservation % segment_granularity != 0) {
    fail("initial_reservation must be a multiple of segment_granularity, got " +
         std::to_string(initial_reservation));
  }
  if (huge_threshold < segment_granularity) {
    fail("huge_threshold must be at least segment_granularity, got " +
         std::to_string(huge_threshold));
  }
}

// =======================================================================================
// Impl: lifetime and the core's hooks

CachingPool::Impl::Impl(MemoryResource& up, CachingPoolOptions opts)
    : StreamOrderedCore(opts.stream_events != nullptr ? *opts.stream_events
                                                      : HostStreamEvents::instance()),
      upstream(up),
      options(opts) {
  options.validate();
}

CachingPool::Impl::~Impl() { release_all(); }

std::string CachingPool::Impl::name() const { return "CachingPool(" + upstream.name() + ")"; }

OutOfMemoryInfo CachingPool::Impl::oom_info(std::size_t requested) const {
  OutOfMemoryInfo info;
  info.requested = requested;
  info.reserved = counters.reserved_bytes.current();
  // Read only, as stats(): draining the quick lists here would change where later blocks
  // go in every shard, the other streams' too (largest_free() walks the parked blocks).
  for (PoolShard* shard : shards()) {
    std::lock_guard lock(shard->mutex);
    info.live += shard->figures.live_bytes;
    info.largest_free = std::max(info.largest_free, shard->largest_free());
  }
  info.capacity = upstream.capacity();
  return info;
}

std::unique_ptr<detail::PoolShard> CachingPool::Impl::make_shard(const ShardKey& key) {
  return std::make_unique<CachingShard>(key.stream);
}

void CachingPool::Impl::recycle(PoolShard& owner, Block* block,
                                std::unique_lock<detail::SpinLock>& /*lock*/) {
  owner.release(block);
  note_free(caching_detail::caching_shard(owner));
}

// =======================================================================================
// Impl: figures

// Live figures are kept per shard (see pool_shard.hpp). Currents add up exactly. So do
// peaks while one stream is in use; with several, a pool-wide peak is the sum of the
// per-stream peaks (capped by the figure above it), an upper bound: tracking the exact
// peak of a sum would make every thread write one shared cache line on every call.
PoolStats CachingPool::Impl::stats() const {
  PoolStats s = shard_stats();
  s.reserved_bytes = counters.reserved_bytes.current();
  s.peak_reserved_bytes = counters.reserved_bytes.peak();
  // The true peaks are ordered (live <= allocated <= reserved, reserved exact), so the
  // smaller bound is still an upper bound and the figures stay consistent.
  s.peak_allocated_bytes = std::min(s.peak_allocated_bytes, s.peak_reserved_bytes);
  s.peak_live_bytes = std::min(s.peak_live_bytes, s.peak_allocated_bytes);
  s.segments = counters.segments.current();
  s.peak_segments = counters.segments.peak();
  s.segment_allocations = counters.segment_allocations.load(std::memory_order_relaxed);
  s.segment_releases = counters.segment_releases.load(std::memory_order_relaxed);
  s.failed_releases = counters.failed_releases.load(std::memory_order_relaxed);
  s.consolidations = counters.consolidations.load(std::memory_order_relaxed);
  return s;
}

void CachingPool::Impl::reset_peak() {
  reset_shard_peaks();
  counters.reserved_bytes.reset_peak();
  counters.segments.reset_peak();
}

void CachingPool::Impl::check_invariants() const {
  const std::vector<PoolShard*>& all = shards();
  const auto locks = lock_all(all);
  const std::size_t reserved = check_shards(all);
  if (counters.reserved_bytes.current() != reserved) {
    throw Error("CachingPool invariant broken: reserved bytes counter says " +
                std::to_string(counters.reserved_bytes.current()) + ", segments add up to " +
                std::to_string(reserved));
  }
}

PoolLayout CachingPool::Impl::layout() const {
  const std::vector<PoolShard*>& all = shards();
  const auto locks = lock_all(all);
  PoolLayout layout;
  for (PoolShard* shard : all) {
    for (const Segment* s = shard->segments; s != nullptr; s = s->next) {
      SegmentLayout& segment = layout.segments.emplace_back();
      segment.address = s->base;
      segment.size = s->size;
      segment.stream = shard->stream;
      segment.huge = s->huge;
      segment.pinned = s->pinned;
      for (const Block* b = s->first; b != nullptr; b = b->next) {
        BlockLayout block{b->addr, b->size, 0, BlockState::kFree};
        if (!b->free && !b->cached) {
          block.requested = b->requested;
          // A block freed on another stream has left the live table but is not free yet.
          block.state =
              shard->find_live(b->addr) == b ? BlockState::kLive : BlockState::kPendingFree;
        }
        segment.blocks.push_back(block);
      }
    }
  }
  std::sort(layout.segments.begin(), layout.segments.end(),
            [](const SegmentLayout& a, const SegmentLayout& b) { return a.address < b.address; });
  return layout;
}

// =======================================================================================
// CachingPool (allocate and free are in fast_path.cpp, next to the fast path)

CachingPool::CachingPool(MemoryResource& upstream, CachingPoolOptions options)
    : impl_(std::make_unique<Impl>(upstream, options)) {
  impl_->reserve_initial();
}

CachingPool::~CachingPool() = default;

void CachingPool::record_stream(void* ptr, Stream stream) { impl_->record_stream(ptr, stream); }

std::size_t CachingPool::allocation_size(const void* ptr) const {
  return impl_->allocation_size(ptr);
}

std::size_t CachingPool::trim() { return impl_->release_free_segments(nullptr, true); }

PoolStats CachingPool::stats() const { return impl_->stats(); }

void CachingPool::reset_peak() { impl_->reset_peak(); }

void CachingPool::check_invariants() const { impl_->check_invariants(); }

PoolLayout CachingPool::layout() const { return impl_->layout(); }

const CachingPoolOptions& CachingPool::options() const { return impl_->options; }

MemoryResource& CachingPool::upstream() const { return impl_->upstream; }

std::size_t CachingPool::capacity() const { return impl_->upstream.capacity(); }

std::string CachingPool::name() const { return impl_->name(); }

}  // namespace sdalloc
