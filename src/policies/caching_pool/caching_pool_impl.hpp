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
// Invariants: a segment belongs to exactly one shard's list or spare; counters.reserved_bytes
// and counters.segments change only under the lock of the shard whose list changes, so with
// every shard locked they equal the sums over the lists. counters.held_bytes and held_ranges
// count the spare segments too; they drop just before a range goes back (exchange, return),
// so they are exact at a quiescent moment. No code path holds two shard locks
// (check_invariants and layout aside, which take them all in table order).
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <memory>
#include <mutex>
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

struct CachingPool::Impl final : detail::StreamOrderedCore {
  Impl(MemoryResource& up, CachingPoolOptions opts);
  ~Impl() override;

  // --- the core's hooks (caching_pool.cpp) --------------------------------------------
  std::string name() const override;
  OutOfMemoryInfo oom_info(std::size_t requested) const override;
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
  // What segments round to in a pool that will hold `pool_bytes`: small_granularity below
  // small_pool_limit, segment_granularity from there on.
  std::size_t segment_grain(std::size_t pool_bytes) const {
    if (pool_bytes < options.small_pool_limit) {
      return std::min(options.small_granularity, options.segment_granularity);
    }
    return options.segment_granularity;
  }
  // What a huge request's own segment rounds to: 1/16 of the request (its highest power of
  // two over 16) where the upstream maps finer pages than `grain` (host memory), so the
  // segment holds at most 1/16 beyond it and a slightly larger request of its kind still
  // fits; `grain` where the upstream does not say (CUDA rounds to 2 MiB anyway).
  std::size_t huge_grain(std::size_t needed, std::size_t grain) const {
    if (upstream_page == 0 || upstream_page >= grain) return grain;
    const std::size_t sixteenth = std::bit_floor(needed) / 16;
    return std::min(grain, std::max(upstream_page, sixteenth));
  }
  // One more try at the shard's cache, under its lock: the slow path's steps each end so.
  static void* allocate_in(PoolShard& shard, const Fit& fit, std::size_t bytes);
  void* allocate_slow(PoolShard& shard, const Fit& fit, std::size_t bytes);
  // Before growing by `growth` bytes past the peak: the shard's wholly free segments (and
  // those of idle streams) go back, the requester's unlinked into the answer for the new
  // range's pages (release_cached_before_growth), and where they fall short of the growth,
  // the free ends cut off the shard's used segments (cut_free_ends) join them; the shard is
  // then churned if the wholly free ones were at least 1/kChurnShare of the growth.
  // With `stitch` (grow_arena's answer), the free runs inside the shard's arenas are cut
  // as well.
  std::vector<Segment*> release_to_grow(PoolShard& shard, std::size_t growth, bool stitch);
  static constexpr std::size_t kChurnShare = 16;
  // Release before growth's other source (where cuts_free_ends()): the free runs of whole
  // pages at the ends of the shard's ordinary segments that still hold live blocks, split
  // off (MemoryResource::split), longest first, until they give `bytes`; appended to `into`
  // as unlinked segments of their own. With `stitch`, every free run of whole pages in the
  // shard's arenas too, their ends and the runs between live blocks (the arena is split
  // around each: see stitches()).
  void cut_free_ends(PoolShard& shard, std::size_t bytes, std::vector<Segment*>& into, bool stitch);
  // Before a new segment of `segment_size` for `fit`: if the shard, no arena yet, will then
  // hold more than 1/kFragmentedShare of its allocated bytes free, its segments serve the
  // work badly, whether or not it ever releases one; it is marked to consolidate (not in a
  // pool that keeps its cache: release_cached_before_growth off).
  void note_fragmented_growth(PoolShard& shard, const Fit& fit, std::size_t segment_size);
  static constexpr std::size_t kFragmentedShare = 16;
  // Grows the shard's arena (the consolidated segment with the most free bytes at its end)
  // in place by what the request lacks, and serves the request there; nullptr when the
  // shard has no arena, the resource cannot grow it, or the grown tail was taken meanwhile
  // (the caller then takes a new segment). The released segments' pages feed the growth.
  // Or sets `stitch` and answers nullptr where stitches() says the arenas' free runs
  // serve the request instead.
  void* grow_arena(PoolShard& shard, const Fit& fit, std::size_t bytes, bool& stitch);
  // Stitching (caller holds shard.mutex): a request the arena lacks `extra` bytes for takes a
  // new segment made of the free pages inside the shard's arenas (cut out between their
  // live blocks, moved by the resource into one range) instead of growing the arena, where
  // growing would take the shard more than 1/kStitchShare above the most it ever had
  // allocated (the request counted), the free pages suffice, and the pool is not small.
  // Best fit in one arena leaves the free bytes of a later pass in pieces around blocks
  // that outlived their neighbours: the SD 1.5 pipeline's VAE decode found 269.7 MiB of
  // free pages in four pieces for a 256 MiB request and grew its arena to 1.251 x live;
  // stitched, it holds 1.001 x. The arena is then in pieces, and the next consolidation (the work
  // churned) makes it whole again, so such a shape makes a few system calls in every pass
  // (docs/caching_pool.md, "Stitching an arena's free pages"). Not in a small pool:
  // torchvision's ResNet-50 stitched in every pass and ran 4.6 x slower.
  bool stitches(PoolShard& shard, const Fit& fit, std::size_t extra) const;
  static constexpr std::size_t kStitchShare = 16;
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
  // Answers the bytes released. With `kept`, the requester's segments are unlinked into it
  // instead of going back (counted all the same): exchange_segments returns them.
  std::size_t release_free_segments(const PoolShard* requester, bool wait,
                                    std::vector<Segment*>* kept = nullptr);
  // Gives segments already unlinked from their shard back to the resource.
  std::size_t return_segments(const std::vector<Segment*>& segments, Stream stream);
  // Gives segments already unlinked from their shard back and takes a new range of `bytes`
  // on `stream`: in one coalesce when the resource moves pages (the pages the segments'
  // work faulted in become the new range's), else returned one by one and then allocated.
  // The segments go back either way; throws what allocate throws.
  void* exchange_segments(const std::vector<Segment*>& segments, std::size_t bytes, Stream stream);
  // The segments' ranges, for a coalesce or a grow; shorter than `segments` (empty) when
  // there is no memory for the list.
  static std::vector<ResourceRange> ranges_of(const std::vector<Segment*>& segments);
  // Forgets segments already unlinked whose ranges the resource has taken back (a coalesce,
  // a grow): off the held counters, counted as released.
  void forget_returned(const std::vector<Segment*>& segments);
  // Arenas grow in place only where the resource can.
  bool grows_arena() const { return options.grow_arena && upstream_grows; }
  // Free ends are cut only where the resource maps pages finer than segments round to
  // (host memory, which splits at any page; not CUDA, whose 2 MiB granularity is the
  // segments' own). In small pools too since 2026-12-07, whose arenas keep a headroom
  // (consolidate) and whose few long-lived blocks do not stop a consolidation (note_low):
  // docs/caching_pool.md, "Free ends in small pools".
  bool cuts_free_ends() const {
    return options.cut_free_ends && upstream_page != 0 &&
           upstream_page < options.segment_granularity;
  }
  // Spare pages are kept only where the resource moves pages into a new range.
  bool keeps_spare() const { return options.keep_spare_pages && upstream_coalesces; }
  // Which of `candidates` (wholly free segments just unlinked from `shard`) and of the
  // shard's spare segments give their pages to a new segment of `bytes`: the largest that
  // fit whole, then the smallest of the rest, which covers what is left (the resource cuts
  // its tail). The others become the shard's spare. Without spare pages: `candidates`.
  std::vector<Segment*> pages_for(PoolShard& shard, std::vector<Segment*> candidates,
                                  std::size_t bytes);
  // A range the resource split in two (MemoryResource::split): one more range held.
  void note_split() {
    counters.held_ranges.add(1);
    counters.segment_splits.fetch_add(1, std::memory_order_relaxed);
  }
  // Unlinks the shard's spare segments (caller holds shard.mutex) for returning or exchange.
  static std::vector<Segment*> take_spare(PoolShard& shard);
  bool give_back(void* base, std::size_t size, Stream stream) noexcept;
  // Consolidation is possible: the shard churned or fragmented, holds several segments, and
  // no block of it waits for another stream.
  bool may_consolidate(const PoolShard& shard) const {
    return (shard.churned || shard.fragmented) &&
           shard.figures.segments + shard.spare.size() >= 2 && options.consolidate_when_empty &&
           shard.pending.empty();
  }
  // After a free on the shard: has the work that churned ended (consolidate())? When the
  // shard is empty; or when it is back at a floor of long-lived blocks, such as a model's
  // weights, after one more cycle of the work above it - one step of a loop. A low is the
  // fewest bytes allocated since the churn (churn_low) and at least half the peak (or,
  // in a small pool, a few long-lived blocks: few_blocks_left). The
  // first low after a churn arms a floor (the lowest of the stretch that follows is kept,
  // and the peak then); the first low after the next churn is the floor again if it is
  // within 1/kFloorTolerance of it and the work rose, in between, to within
  // 1/kFloorTolerance of that peak. Without that rise, a floor reached twice inside one
  // forward pass (rec_sdunet_b2_32x32: 81 MiB of a 145 MiB peak, twice, before a later
  // peak of 153) made an arena too small for what followed: 1.45 x live instead of 1.12.
  // A shard that only fragmented (an ONNX Runtime session: the first run takes its
  // segments, and every later run fits in them, so nothing churns again) needs no churn
  // between the two lows: the floor comes back with no growth in between.
  void note_low(PoolShard& shard) const {
    if (!may_consolidate(shard)) return;  // the steady state: one test
    detail::ShardFigures& f = shard.figures;
    if (f.live_allocations == 0 || nearly_empty(shard)) {
      shard.consolidation_due = true;  // at its next allocation
      return;
    }
    const std::size_t now = f.allocated_bytes;
    if (now > shard.churn_low) return;
    // A low under half the peak is a floor only in a small pool back at a few long-lived
    // blocks: there the cuts make every run churn (its first run is tight), so the rule
    // for a shard that only fragmented (nearly_empty) no longer applies, and an ONNX
    // Runtime session behind one 4 KiB block cut and released segments in every run.
    if (now < f.high_allocated_bytes / 2 && !(small_pool(shard) && few_blocks_left(shard))) {
      return;
    }
    shard.churn_low = now;
    if (!shard.floor_armed || shard.churned_since_floor || !shard.churned) {
      const std::size_t floor = shard.floor_bytes;
      const std::size_t tolerance = floor / kFloorTolerance;
      const std::size_t peak = shard.floor_peak;
      if (shard.floor_armed && now + tolerance >= floor && now <= floor + tolerance &&
          f.peak_allocated_since_mark + peak / kFloorTolerance >= peak) {
        shard.consolidation_due = true;  // at its next allocation
        return;
      }
      shard.floor_armed = true;
      shard.churned_since_floor = false;
      shard.floor_peak = f.high_allocated_bytes;
    }
    shard.floor_bytes = now;
    f.peak_allocated_since_mark = now;
  }
  // A shard that fragmented without churning (an ONNX Runtime session) and is empty but
  // for a few long-lived blocks (the session's first small tensor, a model's buffers of a
  // few KiB), in segments that together hold at most 1/kNearlyEmptyShare of its highest
  // allocated bytes: consolidated as if empty (those segments stay). Such a shard never
  // empties, and the floor rule above needs a floor of half the peak: the session's
  // ResNet-50 runs held 1.456 x their live peak for good behind one 4 KiB block allocated
  // first, 1.104 x so. Not a shard that churned: a GPU UNet trace nearly empty between
  // its passes (33 MiB of 1.1 GB) then made an arena too small for its later 2.7 GB phase,
  // 1.005 -> 1.183 x live (docs/caching_pool.md, "A few long-lived blocks").
  bool nearly_empty(const PoolShard& shard) const {
    return !shard.churned && few_blocks_left(shard);
  }
  // The shard's live blocks, and the segments that hold them, are at most
  // 1/kNearlyEmptyShare of its highest allocated bytes (a walk over its blocks).
  bool few_blocks_left(const PoolShard& shard) const {
    const std::size_t few = shard.figures.high_allocated_bytes / kNearlyEmptyShare;
    return shard.figures.allocated_bytes <= few && shard.bytes_in_used_segments() <= few;
  }
  static constexpr std::size_t kNearlyEmptyShare = 32;
  // The shard's work never reached small_pool_limit.
  bool small_pool(const PoolShard& shard) const {
    return shard.figures.high_allocated_bytes < options.small_pool_limit;
  }
  // The shard churned or fragmented: the fewest bytes allocated since (note_low) start
  // here, or stay lower where they were `kept` from before.
  static void note_churn_low(PoolShard& shard, bool kept) {
    const std::size_t allocated = shard.figures.allocated_bytes;
    shard.churn_low = kept ? std::min(shard.churn_low, allocated) : allocated;
  }
  static constexpr std::size_t kFloorTolerance = 32;
  void consolidate(PoolShard& shard);
  void reserve_initial();

  // --- figures (caching_pool.cpp) -----------------------------------------------------
  PoolStats stats() const;
  void reset_peak();
  void check_invariants() const;
  PoolLayout layout() const;

  MemoryResource& upstream;
  const std::size_t upstream_page;  // upstream.page_size(), asked once
  const bool upstream_coalesces;    // upstream.can_coalesce(), asked once
  const bool upstream_grows;        // upstream.can_grow(), asked once
  CachingPoolOptions options;
  mutable detail::PoolCounters counters;
};

}  // namespace sdalloc
