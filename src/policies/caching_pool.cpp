// caching_pool.cpp - CachingPool: shards per stream, the growth policy and the OOM path.
//
// Fast path (allocate and free of a cached size): find the stream's shard in the published
// shard table (no lock), take that shard's lock, pop its quick list or best-fit in its
// index, carve, count.
// Everything that can make a system call or touch another shard is in the slow path below
// it, which never holds two shard locks at once (so no lock order is needed, except in
// check_invariants, which takes them all in table order while no slow path waits on two).

#include "sdalloc/policies/caching_pool.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "pool/block.hpp"
#include "pool/pool_counters.hpp"
#include "pool/pool_shard.hpp"
#include "core/bits.hpp"

namespace sdalloc {

using detail::Block;
using detail::Fit;
using detail::PoolShard;
using detail::Segment;

namespace {



std::string pointer_text(const void* ptr) {
  char text[32];
  std::snprintf(text, sizeof text, "%p", ptr);
  return text;
}

}  // namespace

void CachingPoolOptions::validate() const {
  auto fail = [](const std::string& what) {
    throw InvalidArgument("CachingPoolOptions: " + what);
  };
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
// Impl

struct CachingPool::Impl {
  Impl(MemoryResource& up, CachingPoolOptions opts)
      : upstream(up),
        options(opts),
        events(opts.stream_events != nullptr ? *opts.stream_events
                                             : HostStreamEvents::instance()) {
    options.validate();
    tables.push_back(std::make_unique<ShardTable>());
    table.store(tables.back().get(), std::memory_order_release);
  }

  // --- shard registry -------------------------------------------------------------------
  // Shards are never removed, so a published table stays valid; a new stream publishes a
  // copy with one more entry and the old copy is kept until the pool dies. The table holds
  // each stream beside its shard so a lookup never reads another shard's cache lines
  // (which that shard's thread keeps writing).
  struct ShardTable {
    std::vector<Stream> streams;
    std::vector<PoolShard*> shards;
  };

  PoolShard& shard_for(Stream stream) {
    const ShardTable* t = table.load(std::memory_order_acquire);
    for (std::size_t i = 0; i < t->streams.size(); ++i) {
      if (t->streams[i] == stream) return *t->shards[i];
    }
    return add_shard(stream);
  }

  PoolShard& add_shard(Stream stream) {
    std::lock_guard lock(registry_mutex);
    const ShardTable* t = table.load(std::memory_order_acquire);
    for (std::size_t i = 0; i < t->streams.size(); ++i) {
      if (t->streams[i] == stream) return *t->shards[i];
    }
    owned_shards.push_back(std::make_unique<PoolShard>(stream));
    auto next = std::make_unique<ShardTable>(*t);
    next->streams.push_back(stream);
    next->shards.push_back(owned_shards.back().get());
    table.store(next.get(), std::memory_order_release);
    tables.push_back(std::move(next));
    return *owned_shards.back();
  }

  std::vector<PoolShard*> all_shards() const {
    return table.load(std::memory_order_acquire)->shards;
  }

  // --- requests ---------------------------------------------------------------------------
  Fit fit_for(std::size_t bytes, std::size_t alignment) const {
    Fit fit;
    fit.rounded = round_up(bytes, kRounding);
    fit.alignment = std::max(alignment, kRounding);
    fit.needed = fit.rounded + (fit.alignment - kRounding);
    fit.huge = fit.rounded >= options.huge_threshold;
    fit.huge_slack = std::max(fit.rounded / 8, options.segment_granularity);
    return fit;
  }

  void check_request(std::size_t bytes, std::size_t alignment) const {
    if (!is_power_of_two(alignment) || alignment > kMaxAlignment) {
      throw InvalidArgument(name() + ": alignment must be a power of two no larger than " +
                            std::to_string(kMaxAlignment) + ", got " +
                            std::to_string(alignment));
    }
    if (bytes > kMaxAllocation) {
      counters.ooms.fetch_add(1, std::memory_order_relaxed);
      throw OutOfMemory::describe(name(), oom_info(bytes),
                                  "larger than the largest allocation sdalloc manages (" +
                                      format_bytes(kMaxAllocation) + ")");
    }
  }

  void* allocate(std::size_t bytes, std::size_t alignment, Stream stream) {
    check_request(bytes, alignment);
    if (bytes == 0) return nullptr;
    const Fit fit = fit_for(bytes, alignment);
    PoolShard& shard = shard_for(stream);
    {
      std::lock_guard lock(shard.mutex);
      // Blocks freed on other streams rejoin the cache as soon as their events complete:
      // polled here (never waited for), one query per pending block, nothing when none is
      // pending. Otherwise a pool whose cache keeps hitting would hold them, and their
      // events, until its next miss.
      if (!shard.pending.empty()) shard.collect_pending(events, /*wait=*/false);
      if (Block* block = shard.allocate(fit, bytes)) return block->ptr();
    }
    return allocate_slow(shard, fit, bytes);
  }

  // One more try at the shard's cache, under its lock: the slow path's steps each end so.
  static void* allocate_in(PoolShard& shard, const Fit& fit, std::size_t bytes) {
    std::lock_guard lock(shard.mutex);
    Block* block = shard.allocate(fit, bytes);
    return block != nullptr ? block->ptr() : nullptr;
  }

  void* allocate_slow(PoolShard& shard, const Fit& fit, std::size_t bytes) {
    // 1. Blocks freed on other streams whose work has completed since.
    {
      std::lock_guard lock(shard.mutex);
      if (!shard.pending.empty() && shard.collect_pending(events, false)) {
        if (Block* block = shard.allocate(fit, bytes)) return block->ptr();
      }
    }
    // 2. A wholly free segment cached by another, idle stream.
    if (void* ptr = allocate_from_other_shards(shard, fit, bytes, /*wait=*/false)) return ptr;
    // 3. A new segment from the resource.
    std::size_t segment_size = round_up(fit.needed, options.segment_granularity);
    const bool huge = fit.huge && segment_size >= options.min_segment_size;
    segment_size = std::max(segment_size, options.min_segment_size);
    if (options.release_cached_before_growth &&
        counters.reserved_bytes.current() + segment_size > counters.reserved_bytes.peak() &&
        release_free_segments(&shard, /*wait=*/false) != 0) {
      std::lock_guard lock(shard.mutex);
      shard.churned = true;  // memory went back only to be asked for again: see consolidate()
    }
    void* base = nullptr;
    try {
      base = upstream.allocate(segment_size, shard.stream);
    } catch (const OutOfMemory&) {
      // 4. Out of memory: wait for pending frees and busy streams, return every cached
      // segment, and retry once.
      counters.oom_retries.fetch_add(1, std::memory_order_relaxed);
      release_free_segments(&shard, /*wait=*/true);
      if (void* ptr = allocate_in(shard, fit, bytes)) return ptr;
      if (void* ptr = allocate_from_other_shards(shard, fit, bytes, /*wait=*/true)) return ptr;
      try {
        base = upstream.allocate(segment_size, shard.stream);
      } catch (const OutOfMemory& refusal) {
        counters.ooms.fetch_add(1, std::memory_order_relaxed);
        throw OutOfMemory::describe(name(), oom_info(bytes),
                                    "a new segment of " + format_bytes(segment_size) +
                                        " was refused after releasing the cache: " +
                                        refusal.what());
      }
    }
    if (base == nullptr) {
      throw Error(name() + ": upstream resource returned null for " +
                  format_bytes(segment_size));
    }
    std::lock_guard lock(shard.mutex);
    Block* block = install_segment(shard, base, segment_size, huge, /*pinned=*/false);
    // The fresh segment fits by construction; take it directly so no other block wins.
    return shard.allocate_from(block, fit, bytes)->ptr();
  }

  // Wraps memory fresh from the resource in a segment of `shard` and answers its one free
  // block. The caller holds shard.mutex. If the records cannot be made (std::bad_alloc),
  // the memory goes back to the resource before the error propagates.
  Block* install_segment(PoolShard& shard, void* base, std::size_t size, bool huge,
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
      upstream.deallocate(base, size, shard.stream);
      throw;
    }
  }

  // Moves a wholly free segment that fits from another shard to `shard` and allocates from
  // it. The segment's last user was the other shard's stream, whose work must be done
  // first: without `wait` a busy stream keeps its segment; with `wait` (the OOM path) the
  // pool waits for it.
  void* allocate_from_other_shards(PoolShard& shard, const Fit& fit, std::size_t bytes,
                                   bool wait) {
    for (PoolShard* other : all_shards()) {
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

  // Returns wholly free, unpinned segments to the resource, each on the stream that last
  // used it (the resource orders the release after that stream's work). Without `wait`,
  // only `requester`'s segments and those of idle streams go; with `wait`, pending
  // cross-stream frees are waited for first and every shard gives up its free segments.
  // Answers the bytes released.
  std::size_t release_free_segments(const PoolShard* requester, bool wait) {
    std::size_t released = 0;
    for (PoolShard* shard : all_shards()) {
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
      released += return_segments(segments, shard->stream);
    }
    return released;
  }

  // --- free -------------------------------------------------------------------------------
  // `expected_bytes` is the size the caller states (deallocate), or nullptr (free).
  void free(void* ptr, Stream stream, const std::size_t* expected_bytes) {
    if (ptr == nullptr) return;
    const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
    PoolShard& shard = shard_for(stream);
    bool freed = false;
    {
      std::lock_guard lock(shard.mutex);
      Block* block = shard.find_live(addr);
      if (block != nullptr && block->other_streams == nullptr) {
        check_size(block, ptr, expected_bytes);
        shard.forget_live(block);
        shard.release(block);
        if (!wants_consolidation(shard)) return;
        freed = true;
      }
    }
    if (freed) {
      consolidate(shard);
    } else {
      free_slow(ptr, stream, expected_bytes);
    }
  }

  // --- consolidation ---------------------------------------------------------------------
  // Separate segments cannot merge. A pool that keeps its footprint low by releasing free
  // segments before it grows (release_cached_before_growth) then asks for the same memory
  // again in every iteration of a loop: system calls and page faults each time. When a
  // stream's shard that has churned so becomes empty while it holds several segments, they
  // are swapped for one segment of the size the shard needed at its peak: the next
  // iteration of the same work runs in one arena, where best fit packs it without growing
  // or releasing (see docs/caching_pool.md for the measurements).
  // A consolidated arena holds at least the peak allocated bytes plus 1/kArenaHeadroom:
  // replays of the SD 1.5 UNet trace need about 1 % beyond the live peak in one arena.
  static constexpr std::size_t kArenaHeadroom = 16;

  bool wants_consolidation(const PoolShard& shard) const {
    return shard.figures.live_allocations == 0 && shard.churned &&
           shard.figures.segments >= 2 && options.consolidate_when_empty &&
           shard.pending.empty();
  }

  void consolidate(PoolShard& shard) {
    std::vector<Segment*> segments;
    std::size_t target = 0;
    {
      std::lock_guard lock(shard.mutex);
      if (!wants_consolidation(shard)) return;  // another thread got there first
      segments = shard.releasable_segments();
      if (segments.size() < 2) return;
      shard.churned = false;
      for (Segment* s : segments) {
        shard.remove_segment(s, /*keep_block=*/false);
        counters.reserved_bytes.sub(s->size);
        counters.segments.sub(1);
      }
      // What the shard held at its peak is what the work needed in segments; one arena
      // packs better, but best fit still needs a little room beyond the live peak.
      const detail::ShardFigures& f = shard.figures;
      const std::size_t needed = std::max(
          f.peak_reserved_bytes, f.peak_allocated_bytes + f.peak_allocated_bytes / kArenaHeadroom);
      target = needed > f.reserved_bytes ? needed - f.reserved_bytes : 0;  // pinned may do
    }
    return_segments(segments, shard.stream);
    if (target == 0) return;
    target = round_up(target, options.segment_granularity);
    void* base = nullptr;
    try {
      base = upstream.allocate(target, shard.stream);
    } catch (const Error&) {
      return;  // an optimisation only: the pool simply holds less now
    }
    std::lock_guard lock(shard.mutex);
    install_segment(shard, base, target, /*huge=*/false, /*pinned=*/false);
    counters.consolidations.fetch_add(1, std::memory_order_relaxed);
  }

  static std::size_t sum_sizes(const std::vector<Segment*>& segments) {
    std::size_t sum = 0;
    for (const Segment* s : segments) sum += s->size;
    return sum;
  }

  // Gives segments already unlinked from their shard back to the resource.
  std::size_t return_segments(const std::vector<Segment*>& segments, Stream stream) {
    std::size_t released = 0;
    for (Segment* s : segments) {
      upstream.deallocate(reinterpret_cast<void*>(s->base), s->size, stream);
      counters.segment_releases.fetch_add(1, std::memory_order_relaxed);
      released += s->size;
      delete s;
    }
    return released;
  }

  void check_size(const Block* block, const void* ptr, const std::size_t* expected) const {
    if (expected != nullptr && *expected != block->requested) {
      throw InvalidArgument(name() + ": deallocate of " + pointer_text(ptr) + " states " +
                            std::to_string(*expected) + " bytes, but it was allocated with " +
                            std::to_string(block->requested));
    }
  }

  // The pointer was allocated on another stream, or is used by other streams, or is not
  // ours at all.
  void free_slow(void* ptr, Stream stream, const std::size_t* expected_bytes) {
    const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
    for (PoolShard* owner : all_shards()) {
      std::unique_lock lock(owner->mutex);
      Block* block = owner->find_live(addr);
      if (block == nullptr) continue;
      check_size(block, ptr, expected_bytes);
      // Work on these streams may still use the block; the owner may reuse it only after.
      detail::PendingFree entry{block, {}};
      auto wait_for = [&](Stream user) {
        if (user == owner->stream) return;
        StreamEvents::Event e = events.record(user);
        if (e != StreamEvents::kNoEvent) entry.events.push_back(e);
      };
      wait_for(stream);
      if (block->other_streams != nullptr) {
        for (Stream user : *block->other_streams) wait_for(user);
        delete block->other_streams;
        block->other_streams = nullptr;
      }
      owner->forget_live(block);
      if (entry.events.empty()) {
        owner->release(block);
        if (wants_consolidation(*owner)) {
          lock.unlock();
          consolidate(*owner);
        }
      } else {
        owner->pending.push_back(std::move(entry));
      }
      return;
    }
    throw InvalidPointer(name() + ": free of " + pointer_text(ptr) + ", which is " +
                             describe_foreign(addr),
                         ptr);
  }

  // Why a pointer is not a live allocation: a double free, an interior pointer, or foreign.
  std::string describe_foreign(std::uintptr_t addr) const {
    for (PoolShard* shard : all_shards()) {
      std::lock_guard lock(shard->mutex);
      for (const Segment* s = shard->segments; s != nullptr; s = s->next) {
        if (addr < s->base || addr >= s->base + s->size) continue;
        for (const Block* b = s->first; b != nullptr; b = b->next) {
          if (addr < b->addr || addr >= b->end()) continue;
          if (b->free && addr == b->addr) {
            return "already free (double free?)";
          }
          if (!b->free && addr != b->addr) {
            return "inside a live allocation that starts at " + pointer_text(b->ptr()) +
                   " (interior pointer)";
          }
          return "inside this pool's memory but not the start of a live allocation "
                 "(already freed?)";
        }
      }
    }
    return "not memory of this pool (never allocated here)";
  }

  Block* find_live_anywhere(const void* ptr, PoolShard** owner_out) const {
    const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
    for (PoolShard* shard : all_shards()) {
      shard->mutex.lock();
      if (Block* block = shard->find_live(addr)) {
        *owner_out = shard;  // returned locked
        return block;
      }
      shard->mutex.unlock();
    }
    throw InvalidPointer(name() + ": " + pointer_text(ptr) + " is " +
                             describe_foreign(addr),
                         ptr);
  }

  void record_stream(void* ptr, Stream stream) {
    if (ptr == nullptr) return;
    PoolShard* owner = nullptr;
    Block* block = find_live_anywhere(ptr, &owner);
    std::lock_guard lock(owner->mutex, std::adopt_lock);
    if (stream == owner->stream) return;
    if (block->other_streams == nullptr) block->other_streams = new std::vector<Stream>();
    auto& users = *block->other_streams;
    if (std::find(users.begin(), users.end(), stream) == users.end()) users.push_back(stream);
  }

  std::size_t allocation_size(const void* ptr) const {
    PoolShard* owner = nullptr;
    Block* block = find_live_anywhere(ptr, &owner);
    std::lock_guard lock(owner->mutex, std::adopt_lock);
    return block->requested;
  }

  // --- figures ------------------------------------------------------------------------------
  OutOfMemoryInfo oom_info(std::size_t requested) const {
    OutOfMemoryInfo info;
    info.requested = requested;
    info.reserved = counters.reserved_bytes.current();
    for (PoolShard* shard : all_shards()) {
      std::lock_guard lock(shard->mutex);
      shard->drain_quick_lists();
      info.live += shard->figures.live_bytes;
      info.largest_free = std::max(info.largest_free, shard->largest_free());
    }
    info.capacity = upstream.capacity();
    return info;
  }

  // Live figures are kept per shard (see pool_shard.hpp). Currents add up exactly. So do
  // peaks while one stream is in use; with several, a pool-wide peak is the sum of the
  // per-stream peaks (capped by the figure above it), an upper bound: tracking the exact
  // peak of a sum would make every thread write one shared cache line on every call.
  PoolStats stats() const {
    PoolStats s;
    for (PoolShard* shard : all_shards()) {
      std::lock_guard lock(shard->mutex);
      shard->drain_quick_lists();  // so largest_free_block is what a request would find
      const detail::ShardFigures& f = shard->figures;
      s.live_bytes += f.live_bytes;
      s.peak_live_bytes += f.peak_live_bytes;
      s.allocated_bytes += f.allocated_bytes;
      s.peak_allocated_bytes += f.peak_allocated_bytes;
      s.live_allocations += f.live_allocations;
      s.peak_live_allocations += f.peak_live_allocations;
      s.allocations += f.allocations;
      s.frees += f.frees;
      s.free_bytes += shard->free_bytes();
      s.largest_free_block = std::max(s.largest_free_block, shard->largest_free());
      s.pending_free_bytes += shard->pending_bytes();
      ++s.streams;
    }
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
    s.oom_retries = counters.oom_retries.load(std::memory_order_relaxed);
    s.consolidations = counters.consolidations.load(std::memory_order_relaxed);
    s.ooms = counters.ooms.load(std::memory_order_relaxed);
    return s;
  }

  void reset_peak() {
    for (PoolShard* shard : all_shards()) {
      std::lock_guard lock(shard->mutex);
      shard->figures.reset_peak();
    }
    counters.reserved_bytes.reset_peak();
    counters.segments.reset_peak();
  }

  void check_invariants() const {
    const std::vector<PoolShard*> shards = all_shards();
    std::vector<std::unique_lock<detail::SpinLock>> locks;
    locks.reserve(shards.size());
    for (PoolShard* shard : shards) locks.emplace_back(shard->mutex);
    std::size_t reserved = 0;
    for (PoolShard* shard : shards) shard->check(reserved);
    if (counters.reserved_bytes.current() != reserved) {
      throw Error("CachingPool invariant broken: reserved bytes counter says " +
                  std::to_string(counters.reserved_bytes.current()) +
                  ", segments add up to " + std::to_string(reserved));
    }
  }

  PoolLayout layout() const {
    const std::vector<PoolShard*> shards = all_shards();
    std::vector<std::unique_lock<detail::SpinLock>> locks;
    locks.reserve(shards.size());
    for (PoolShard* shard : shards) locks.emplace_back(shard->mutex);
    PoolLayout layout;
    for (PoolShard* shard : shards) {
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
            block.state = shard->find_live(b->addr) == b ? BlockState::kLive
                                                         : BlockState::kPendingFree;
          }
          segment.blocks.push_back(block);
        }
      }
    }
    std::sort(layout.segments.begin(), layout.segments.end(),
              [](const SegmentLayout& a, const SegmentLayout& b) { return a.address < b.address; });
    return layout;
  }

  std::string name() const { return "CachingPool(" + upstream.name() + ")"; }

  // --- lifetime ----------------------------------------------------------------------------
  void reserve_initial() {
    if (options.initial_reservation == 0) return;
    PoolShard& shard = shard_for(kDefaultStream);
    void* base = upstream.allocate(options.initial_reservation, shard.stream);
    std::lock_guard lock(shard.mutex);
    install_segment(shard, base, options.initial_reservation, /*huge=*/false, /*pinned=*/true);
  }

  ~Impl() {
    for (PoolShard* shard : all_shards()) {
      std::lock_guard lock(shard->mutex);
      shard->collect_pending(events, true);
      shard->live.for_each([](std::uintptr_t, Block* block) {
        delete block->other_streams;
        block->other_streams = nullptr;
      });
      for (Segment* s = shard->segments; s != nullptr;) {
        Segment* next = s->next;
        upstream.deallocate(reinterpret_cast<void*>(s->base), s->size, shard->stream);
        delete s;
        s = next;
      }
      shard->segments = nullptr;
    }
  }

  MemoryResource& upstream;
  CachingPoolOptions options;
  StreamEvents& events;
  mutable detail::PoolCounters counters;

  std::atomic<const ShardTable*> table{nullptr};
  std::mutex registry_mutex;
  std::vector<std::unique_ptr<ShardTable>> tables;
  std::vector<std::unique_ptr<PoolShard>> owned_shards;
};

// =======================================================================================
// CachingPool

CachingPool::CachingPool(MemoryResource& upstream, CachingPoolOptions options)
    : impl_(std::make_unique<Impl>(upstream, options)) {
  impl_->reserve_initial();
}

CachingPool::~CachingPool() = default;

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
