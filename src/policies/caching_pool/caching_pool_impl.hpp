// caching_pool_impl.hpp - CachingPool::Impl: the stream-ordered core over segments of an
// upstream resource (internal to src/policies/caching_pool/).
//
// The core (src/pool/stream_ordered_core.hpp) holds the shards, cross-stream frees, checks,
// figures and invariants. What is CachingPool's own lives in this folder:
//   fast_path.cpp   allocate and free of a cached size, and the slow path of allocate (pending
//                   frees, another idle stream's free segment, a new segment, OOM retry);
//   segments.cpp    installing, releasing and returning segments, and consolidation;
//   caching_pool.cpp options, the core's hooks, figures, layout and the public facade.
//
// Invariants: a segment belongs to exactly one shard's list; counters.reserved_bytes and
// counters.segments change only under the lock of the shard whose list changes, so with
// every shard locked they equal the sums over the lists. No code path holds two shard
// locks (check_invariants and layout aside, which take them all in table order).
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "pool/block.hpp"
#include "pool/block_limits.hpp"
#include "pool/pool_counters.hpp"
#include "pool/pool_shard.hpp"
#include "pool/stream_ordered_core.hpp"
#include "sdalloc/policies/caching_pool.hpp"

namespace sdalloc {

static_assert(CachingPool::kRounding == detail::kBlockRounding);
static_assert(CachingPool::kMaxAlignment == detail::kMaxBlockAlignment);
static_assert(CachingPool::kMaxAllocation == detail::kMaxBlockAllocation);

namespace caching_detail {

// One stream's shard with what consolidation ("Consolidation" in caching_pool.hpp) tracks,
// all under the shard's lock. Since the stream churned: the fewest bytes it had allocated
// (`low`) and the peak of its last step, from the low back to it (`rise`, 0 before the first;
// the peak since the low is the shard's peak_allocated_since_mark). `due`: a repeated step has
// ended, the arena is made at the next allocation. `arena_work`: the peak of allocated bytes
// its last arena was made for (0: none yet); where the same work churned again, the next arena
// also holds what was taken beside that one (the shard's peak_reserved_since_mark).
struct CachingShard final : detail::PoolShard {
  explicit CachingShard(Stream s) : PoolShard(s) {}
  bool churned = false;
  bool due = false;
  std::size_t low = 0;
  std::size_t rise = 0;
  std::size_t arena_work = 0;
};

inline CachingShard& caching_shard(detail::PoolShard& shard) {
  return static_cast<CachingShard&>(shard);
}

}  // namespace caching_detail

struct CachingPool::Impl final : detail::StreamOrderedCore {
  using CachingShard = caching_detail::CachingShard;

  Impl(MemoryResource& up, CachingPoolOptions opts);
  ~Impl() override;

  // --- the core's hooks (caching_pool.cpp) --------------------------------------------
  std::string name() const override;
  OutOfMemoryInfo oom_info(std::size_t requested) const override;
  std::unique_ptr<PoolShard> make_shard(const ShardKey& key) override;
  void recycle(PoolShard& owner, Block* block, std::unique_lock<detail::SpinLock>& lock) override;
  void destroy_segment(PoolShard& shard, Segment* segment) noexcept override;

  // --- allocate (fast_path.cpp) -------------------------------------------------------
  Fit fit_for(std::size_t bytes, std::size_t alignment) const {
    Fit fit = StreamOrderedCore::fit_for(bytes, alignment);
    fit.huge = fit.rounded >= options.huge_threshold;
    fit.huge_slack = std::max(fit.rounded / 8, options.segment_granularity);
    return fit;
  }
  void* allocate(std::size_t bytes, std::size_t alignment, Stream stream);
  // One more try at the shard's cache, under its lock: the slow path's steps each end so.
  static void* allocate_in(PoolShard& shard, const Fit& fit, std::size_t bytes);
  void* allocate_slow(CachingShard& shard, const Fit& fit, std::size_t bytes);
  // Before a new segment of `growth` bytes: if it would take the pool past its peak, the
  // wholly free segments of the shard and of idle streams go back (release before growth),
  // and the shard has churned if some of its own went (note_churn).
  void release_to_grow(CachingShard& shard, std::size_t growth);
  // Moves a wholly free segment that fits from another shard to `shard` and allocates from
  // it. The segment's last user was the other shard's stream, whose work must be done
  // first: without `wait` a busy stream keeps its segment; with `wait` (the OOM path) the
  // pool waits for it.
  void* allocate_from_other_shards(PoolShard& shard, const Fit& fit, std::size_t bytes, bool wait);

  // --- free (fast_path.cpp) -----------------------------------------------------------
  // `expected_bytes` is the size the caller states (deallocate), or nullptr (free).
  void free(void* ptr, Stream stream, const std::size_t* expected_bytes);

  // --- segments (segments.cpp) --------------------------------------------------------
  // Wraps memory fresh from the resource in a segment of `shard` and answers its one free
  // block. The caller holds shard.mutex. If the records cannot be made (std::bad_alloc),
  // the memory goes back to the resource before the error propagates.
  Block* install_segment(PoolShard& shard, void* base, std::size_t size, bool huge, bool pinned);
  // Returns wholly free, unpinned segments to the resource, each on the stream that last
  // used it (the resource orders the release after that stream's work). Without `wait`,
  // only `requester`'s segments and those of idle streams go; with `wait`, pending
  // cross-stream frees are waited for first and every shard gives up its free segments.
  // Answers the bytes released; `own` (if given) the requester's share of them.
  std::size_t release_free_segments(const PoolShard* requester, bool wait,
                                    std::size_t* own = nullptr);
  // Gives segments already unlinked from their shard back to the resource.
  std::size_t return_segments(const std::vector<Segment*>& segments, Stream stream);
  bool give_back(void* base, std::size_t size, Stream stream) noexcept;
  // The shard released segments to grow (its lock held): its stretches are counted from here.
  static void note_churn(CachingShard& shard) {
    if (shard.churned) return;
    shard.churned = true;
    shard.low = shard.figures.allocated_bytes;
    shard.rise = 0;
    shard.figures.peak_allocated_since_mark = shard.low;
  }
  // After a free on the shard (its lock held): has the churned work gone through a repeated
  // step? It has when the stream is empty, or when its allocated bytes have come back to their
  // low (the fewest since the churn) twice after rising, each time by at least half of the
  // work (the most the stream ever held above that low), to the same peak; "at" the low or
  // peak means within 1/kLowTolerance of the work. A stretch that rises and falls above the
  // low (the layers inside one step) is no step. Constant time.
  void note_free(CachingShard& shard) const {
    if (!shard.churned || shard.due || !options.consolidate_when_empty) return;
    detail::ShardFigures& f = shard.figures;
    const std::size_t now = f.allocated_bytes;
    if (f.live_allocations == 0) {
      shard.due = true;
      return;
    }
    const std::size_t tolerance =
        (f.high_allocated_bytes - std::min(now, shard.low)) / kLowTolerance;
    if (now < shard.low) {
      if (now + tolerance < shard.low) shard.rise = 0;  // a lower low: the steps start again
      shard.low = now;
    }
    if (now > shard.low + tolerance) return;
    const std::size_t peak = f.peak_allocated_since_mark;
    if (peak - shard.low < (f.high_allocated_bytes - shard.low) / 2) return;  // no step's work
    if (shard.rise != 0 && peak + tolerance >= shard.rise && peak <= shard.rise + tolerance) {
      shard.due = true;
      return;
    }
    shard.rise = peak;
    f.peak_allocated_since_mark = now;
  }
  static constexpr std::size_t kLowTolerance = 32;
  // Swaps the shard's wholly free segments for one arena (see "Consolidation"). An
  // optimisation only: a failure leaves the pool holding less, never broken.
  void consolidate(CachingShard& shard);
  // What a best fit in one arena needs beyond the work's peak: 1/kArenaHeadroom of it.
  static constexpr std::size_t kArenaHeadroom = 16;
  void reserve_initial();

  // --- figures (caching_pool.cpp) -----------------------------------------------------
  PoolStats stats() const;
  void reset_peak();
  void check_invariants() const;
  PoolLayout layout() const;

  MemoryResource& upstream;
  CachingPoolOptions options;
  mutable detail::PoolCounters counters;
};

}  // namespace sdalloc
