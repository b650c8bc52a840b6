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
    counters.held_bytes.add(size);
    counters.held_ranges.add(1);
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
                                                     std::vector<Segment*>* kept) {
  std::size_t released = 0;
  for (PoolShard* shard : shards()) {
    std::vector<Segment*> segments;
    std::vector<Segment*> spare;
    {
      std::lock_guard lock(shard->mutex);
      if (wait && !shard->pending.empty()) shard->collect_pending(events, true);
      if (!wait && shard != requester && !events.idle(shard->stream)) continue;
      segments = shard->releasable_segments();
      if (kept != nullptr && shard == requester) kept->reserve(kept->size() + segments.size());
      for (Segment* s : segments) {
        shard->remove_segment(s, /*keep_block=*/false);
        counters.reserved_bytes.sub(s->size);
        counters.segments.sub(1);
      }
      // A requester that keeps its segments decides about its spare ones too (pages_for).
      if (kept == nullptr || shard != requester) spare = take_spare(*shard);
    }
    released += return_segments(spare, shard->stream);
    if (kept != nullptr && shard == requester) {
      for (Segment* s : segments) released += s->size;
      kept->insert(kept->end(), segments.begin(), segments.end());
    } else {
      released += return_segments(segments, shard->stream);
    }
  }
  return released;
}

void CachingPool::Impl::cut_free_ends(PoolShard& shard, std::size_t bytes,
                                      std::vector<Segment*>& into, bool stitch) {
  if (!cuts_free_ends()) return;
  using Run = detail::PageRun;  // whole pages of one free block
  const std::size_t page = upstream_page;
  std::lock_guard lock(shard.mutex);
  // Arenas keep their ends, but for a small pool's: its first arena is often made when the
  // work was a fraction of its later size (MobileNetV2: 1.25 MiB, before the 4.6 MiB
  // activations came; 1.107 -> 1.074 x live with its ends cut). A stitch takes every free
  // run of the arenas, those between live blocks too.
  const bool cut_arenas = small_pool(shard) || stitch;
  std::vector<Run> runs;
  try {
    for (Segment* s = shard.segments; s != nullptr; s = s->next) {
      if ((s->arena && !cut_arenas) || s->huge || s->pinned || s->growing) continue;
      if (const std::size_t n = shard.free_end(s, page, /*front=*/true)) {
        runs.push_back({s->base, s->base + n});
      }
      if (const std::size_t n = shard.free_end(s, page, /*front=*/false)) {
        runs.push_back({s->base + s->size - n, s->base + s->size});
      }
      if (!stitch || !s->arena || s->first->is_whole_segment()) continue;
      for (const Block* b = s->first->next; b->next != nullptr; b = b->next) {
        if (!b->indexed) continue;
        const Run run = PoolShard::whole_pages(b, page);
        if (run.bytes() != 0) runs.push_back(run);
      }
    }
    into.reserve(into.size() + runs.size());  // so that no push_back below throws
  } catch (const std::bad_alloc&) {
    return;  // an optimisation only
  }
  std::sort(runs.begin(), runs.end(),
            [](const Run& x, const Run& y) { return x.bytes() > y.bytes(); });
  std::size_t taken = 0;
  bool stitched = false;  // a run of an arena's was taken for a stitch
  for (const Run& run : runs) {
    if (taken >= bytes) break;
    // The segment that holds the run now: an earlier cut may have split the one it was in.
    Segment* s = shard.segments;
    while (s != nullptr && (run.lo < s->base || run.lo >= s->base + s->size)) s = s->next;
    if (s == nullptr) continue;
    // A run between live blocks: the segment is split at the run's end first, so that the
    // run is the lower part's free end.
    if (run.lo != s->base && run.hi != s->base + s->size) {
      Segment* upper = nullptr;
      try {
        upper = new Segment{};
        shard.records.reserve(1);
      } catch (const std::bad_alloc&) {
        delete upper;
        break;
      }
      if (!upstream.split(reinterpret_cast<void*>(s->base), s->size, run.hi - s->base)) {
        delete upper;
        continue;
      }
      shard.split_segment(s, run.hi, upper, shard.records.take());
      counters.segments.add(1);
      note_split();
    }
    Segment* piece = nullptr;
    try {
      piece = new Segment{};
    } catch (const std::bad_alloc&) {
      break;
    }
    const bool front = run.lo == s->base;
    const std::size_t n = run.bytes();
    const std::size_t first = front ? n : s->size - n;
    if (!upstream.split(reinterpret_cast<void*>(s->base), s->size, first)) {
      delete piece;
      continue;
    }
    piece->base = run.lo;
    piece->size = n;
    piece->used = true;
    stitched = stitched || (stitch && s->arena);
    shard.trim_segment(s, n, front);
    counters.reserved_bytes.sub(n);
    note_split();
    into.push_back(piece);
    taken += n;
  }
  if (stitched) counters.stitches.fetch_add(1, std::memory_order_relaxed);
}

std::vector<Segment*> CachingPool::Impl::take_spare(PoolShard& shard) {
  std::vector<Segment*> spare;
  spare.swap(shard.spare);
  return spare;
}

std::vector<Segment*> CachingPool::Impl::pages_for(PoolShard& shard,
                                                   std::vector<Segment*> candidates,
                                                   std::size_t bytes) {
  if (!keeps_spare()) return candidates;
  std::lock_guard lock(shard.mutex);
  if (candidates.empty() && shard.spare.empty()) return candidates;
  std::vector<Segment*> take;
  std::vector<Segment*> rest;
  try {
    candidates.reserve(candidates.size() + shard.spare.size());
    take.reserve(candidates.capacity());
    rest.reserve(candidates.capacity());
  } catch (const std::bad_alloc&) {
    return candidates;  // no room for the lists: the spare ones stay spare
  }
  candidates.insert(candidates.end(), shard.spare.begin(), shard.spare.end());
  take_spare(shard);
  std::sort(candidates.begin(), candidates.end(),
            [](const Segment* a, const Segment* b) { return a->size > b->size; });
  std::size_t taken = 0;
  for (Segment* s : candidates) {
    if (taken + s->size <= bytes) {
      take.push_back(s);
      taken += s->size;
    } else {
      rest.push_back(s);
    }
  }
  // Each one left is larger than what the new segment still lacks: the smallest of them
  // gives that much (split off where the resource allows; else all of it, its tail going
  // back), rather than fresh pages faulted in. Without the split, a 1 GiB segment released
  // for a 64 MiB one gave up 960 MiB of pages, and SD 1.5's UNet kept no spare at all.
  if (taken < bytes && !rest.empty()) {
    Segment* s = rest.back();
    const std::size_t lacking = bytes - taken;
    Segment* tail = nullptr;
    try {
      tail = new Segment{};
    } catch (const std::bad_alloc&) {
    }
    if (tail != nullptr && upstream.split(reinterpret_cast<void*>(s->base), s->size, lacking)) {
      tail->base = s->base + lacking;
      tail->size = s->size - lacking;
      s->size = lacking;
      rest.back() = tail;
      note_split();
    } else {
      delete tail;
      rest.pop_back();
    }
    take.push_back(s);
  }
  shard.spare = std::move(rest);
  return take;
}

std::size_t CachingPool::Impl::return_segments(const std::vector<Segment*>& segments,
                                               Stream stream) {
  std::size_t released = 0;
  for (Segment* s : segments) {
    counters.held_bytes.sub(s->size);  // gone from the pool's view even if the resource fails
    counters.held_ranges.sub(1);
    if (give_back(reinterpret_cast<void*>(s->base), s->size, stream)) released += s->size;
    delete s;
  }
  return released;
}

void* CachingPool::Impl::exchange_segments(const std::vector<Segment*>& segments, std::size_t bytes,
                                           Stream stream) {
  if (segments.empty()) return upstream.allocate(bytes, stream);
  std::vector<ResourceRange> ranges;
  if (upstream.can_coalesce()) ranges = ranges_of(segments);
  if (ranges.size() < segments.size()) {  // the plain way: it needs no list
    return_segments(segments, stream);
    return upstream.allocate(bytes, stream);
  }
  // A resource that coalesces cannot fail to take the ranges back: they are released
  // whether or not the new range is refused.
  forget_returned(segments);
  return upstream.coalesce(ranges, bytes, stream);
}

std::vector<ResourceRange> CachingPool::Impl::ranges_of(const std::vector<Segment*>& segments) {
  std::vector<ResourceRange> ranges;
  try {
    ranges.reserve(segments.size());
  } catch (const std::bad_alloc&) {
    return ranges;  // no room for the list
  }
  for (const Segment* s : segments) ranges.push_back({reinterpret_cast<void*>(s->base), s->size});
  return ranges;
}

void CachingPool::Impl::forget_returned(const std::vector<Segment*>& segments) {
  for (Segment* s : segments) {
    counters.held_bytes.sub(s->size);
    counters.held_ranges.sub(1);
    delete s;
  }
  counters.segment_releases.fetch_add(segments.size(), std::memory_order_relaxed);
}

void CachingPool::Impl::destroy_segment(PoolShard& shard, Segment* segment) noexcept {
  counters.held_bytes.sub(segment->size);
  counters.held_ranges.sub(1);
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

// =======================================================================================
// arena growth
//
// An arena sized for one shape is too small for a larger one (the next resolution, the VAE
// decoder after the UNet). A segment beside it stays apart from it for good: the arena's
// free space and the segment's never merge, so the pool held both (1.55 x live on the
// ascending sequence of docs/caching_pool.md). Where the resource can, the arena grows
// in place instead, by what the request lacks beyond the arena's free tail: the work then
// runs in one larger arena, as if it had been consolidated at its new peak.

bool CachingPool::Impl::stitches(PoolShard& shard, const Fit& fit, std::size_t extra) const {
  if (!cuts_free_ends() || small_pool(shard)) return false;
  const detail::ShardFigures& f = shard.figures;
  const std::size_t high = std::max(f.high_allocated_bytes, f.allocated_bytes + fit.needed);
  if (f.reserved_bytes + extra <= high + high / kStitchShare) return false;
  std::size_t free_pages = 0;
  for (const Segment* s = shard.segments; s != nullptr && free_pages < fit.needed; s = s->next) {
    if (s->arena && !s->growing) free_pages += shard.free_pages(s, upstream_page);
  }
  return free_pages >= fit.needed;
}

void* CachingPool::Impl::grow_arena(PoolShard& shard, const Fit& fit, std::size_t bytes,
                                    bool& stitch) {
  if (!grows_arena()) return nullptr;
  Segment* arena = nullptr;
  std::size_t extra = 0;
  Block* record = nullptr;  // taken now: once the range has grown, the books must follow
  {
    std::lock_guard lock(shard.mutex);
    // Another thread on this stream may have freed enough since the caller looked.
    if (Block* block = shard.allocate(fit, bytes)) return block->ptr();
    std::size_t tail = 0;  // < fit.needed now: best fit would have taken a tail that fits
    for (Segment* s = shard.segments; s != nullptr; s = s->next) {
      if (!s->arena || s->growing) continue;
      const std::size_t free_tail = shard.free_tail(s);
      if (arena == nullptr || free_tail > tail) {
        arena = s;
        tail = free_tail;
      }
    }
    if (arena == nullptr) return nullptr;
    // Whole pages where the resource maps pages finer than segments round to (host memory:
    // the arena holds nothing beyond what it lacked; a later, larger request grows it again,
    // once), else the segment granularity.
    std::size_t grain = segment_grain(counters.reserved_bytes.high() + fit.needed);
    if (upstream_page != 0 && upstream_page < grain) grain = upstream_page;
    extra = round_up(fit.needed - tail, grain);
    if (stitches(shard, fit, extra)) {
      stitch = true;
      return nullptr;
    }
    shard.records.reserve(1);
    record = shard.records.take();
    arena->growing = true;  // not released, not adopted by another shard meanwhile
  }
  const auto unmark = [&] {  // under the shard's lock
    arena->growing = false;
    shard.records.give_back(record);
  };
  std::vector<Segment*> donors;
  try {
    donors = pages_for(shard, release_to_grow(shard, extra, /*stitch=*/false), extra);
  } catch (...) {  // no memory for the lists: nothing was given back
    std::lock_guard lock(shard.mutex);
    unmark();
    throw;
  }
  const std::vector<ResourceRange> ranges = ranges_of(donors);
  if (ranges.size() < donors.size()) {  // no room for the list: fresh pages instead
    return_segments(donors, shard.stream);
    donors.clear();
  }
  bool grown = false;
  try {
    grown = upstream.grow(reinterpret_cast<void*>(arena->base), arena->size, arena->size + extra,
                          ranges, shard.stream);
  } catch (const Error&) {
    forget_returned(donors);  // refused: the resource has taken the donors back all the same
    std::lock_guard lock(shard.mutex);
    unmark();
    return nullptr;  // the new segment's path meets the refusal and its OOM handling
  }
  if (!grown) {
    // Nothing changed: the donors stay held as spare pages for the new segment (or, where
    // the pool keeps none or cannot list them, they go back).
    bool kept = false;
    {
      std::lock_guard lock(shard.mutex);
      unmark();
      try {
        if (keeps_spare()) shard.spare.insert(shard.spare.end(), donors.begin(), donors.end());
        kept = keeps_spare();
      } catch (const std::bad_alloc&) {  // NOLINT(bugprone-empty-catch): returned below
      }
    }
    if (!kept) return_segments(donors, shard.stream);
    return nullptr;
  }
  forget_returned(donors);
  std::lock_guard lock(shard.mutex);
  arena->growing = false;
  Block* tail = shard.extend_segment(arena, extra, record);
  counters.reserved_bytes.add(extra);
  counters.held_bytes.add(extra);
  counters.arena_growths.fetch_add(1, std::memory_order_relaxed);
  if (tail->size >= fit.needed) return shard.allocate_from(tail, fit, bytes)->ptr();
  Block* block = shard.allocate(fit, bytes);  // another thread took part of the tail
  return block != nullptr ? block->ptr() : nullptr;
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
// segments before it grows (release_cached_before_growth) then asks for the same memory
// again in every iteration of a loop: system calls and page faults each time. When the
// work of a stream's shard that has churned so ends (it is empty, or back at a floor of
// long-lived blocks: note_low in caching_pool_impl.hpp) while it holds several segments,
// its wholly free ones are swapped for one segment of the size the shard needed at its
// peak: the next iteration of the same work runs in one arena (beside the segments of the
// long-lived blocks), where best fit packs it without growing or releasing (see
// docs/caching_pool.md for the measurements).

namespace {
// A consolidated arena that cannot grow holds at least the peak allocated bytes plus
// 1/kArenaHeadroom of what the work needed above the floor it ended at (all of it when the
// stream is empty): replays of the SD 1.5 UNet trace need about 1 % beyond the live peak in
// one arena, and the long-lived blocks below the floor stay where they are. One that can
// grow (grow_arena) holds no headroom: it grows by what best fit lacks, once (SD 1.5's UNet
// 1.063 -> 1.007 x live; docs/caching_pool.md, "Arena growth").
constexpr std::size_t kArenaHeadroom = 16;
}  // namespace

void CachingPool::Impl::consolidate(PoolShard& shard) {
  std::vector<Segment*> segments;
  std::size_t target = 0;
  std::size_t grain = options.segment_granularity;
  {
    std::lock_guard lock(shard.mutex);
    shard.consolidation_due = false;
    if (!may_consolidate(shard)) return;  // another thread got there first, or in use
    segments = shard.releasable_segments();
    if (segments.empty() && shard.spare.empty()) return;
    const bool churned = shard.churned;
    // What the shard held at its peak is what the work needed in segments; one arena
    // packs better, but best fit still needs a little room beyond the live peak. The
    // segments that stay (those still holding blocks) count towards it.
    const detail::ShardFigures& f = shard.figures;
    std::size_t staying = f.reserved_bytes;
    for (const Segment* s : segments) staying -= s->size;
    // Nearly empty (note_low): the few live blocks sit in small segments whose free room
    // serves none of the work's tensors; the arena holds the work as if only those blocks
    // stayed (one 128 KiB smaller, beside a 4 KiB block's 128 KiB segment, grew to 1.409 x
    // the live peak of an ONNX Runtime session's runs; 1.104 x so, that segment counted).
    if (f.live_allocations != 0 && nearly_empty(shard)) staying = f.allocated_bytes;
    // A shard that only fragmented held more than its work needed at its peak: its arena
    // is sized on allocated bytes alone. It keeps the headroom even where it could grow,
    // as does a small pool's (below small_pool_limit), whose first pass the free ends it
    // cut made tight: best fit in an arena grown at its tail by what it lacked, for a
    // large tensor among a few small ones that outlived their neighbours, held 1.385 x live
    // on an ONNX Runtime session's ResNet-50 run, 1.080 x with the headroom
    // (docs/caching_pool.md, "Free ends in small pools").
    const std::size_t headroom =
        grows_arena() && churned && !small_pool(shard)
            ? 0
            : (f.high_allocated_bytes - f.allocated_bytes) / kArenaHeadroom;
    const std::size_t needed =
        std::max(churned ? f.high_reserved_bytes : 0, f.high_allocated_bytes + headroom);
    target = needed > staying ? needed - staying : 0;  // pinned may do
    grain = segment_grain(needed);
    // One free range is worth swapping only for a larger one. Small work under weights
    // (ResNet-18's 10 MiB under 0.5-3.4 GB) lives mostly in the free tails of the weights'
    // segments and churns between segments of its own, only one of them free at its floor:
    // consolidation used to need two, and the work released and took segments in every
    // step. Where that one range already has the size the work needed in segments and the
    // work still churned around it (memory as a GPU's: nothing grows), the room it lacked
    // was best fit's waste in one piece: the arena gets the headroom.
    if (segments.size() + shard.spare.size() == 1) {
      const std::size_t size = segments.empty() ? shard.spare.front()->size : segments[0]->size;
      if (churned && round_up(target, grain) <= size) {
        target = size + (f.high_allocated_bytes - f.allocated_bytes) / kArenaHeadroom;
      }
      if (round_up(target, grain) <= size) return;
    }
    try {
      segments.reserve(segments.size() + shard.spare.size());
    } catch (const std::bad_alloc&) {
      return;  // an optimisation only
    }
    shard.churned = false;
    shard.fragmented = false;
    shard.floor_armed = false;
    for (Segment* s : segments) {
      shard.remove_segment(s, /*keep_block=*/false);
      counters.reserved_bytes.sub(s->size);
      counters.segments.sub(1);
    }
    // The spare pages go into the arena too, before any fresh page.
    const std::vector<Segment*> spare = take_spare(shard);
    segments.insert(segments.end(), spare.begin(), spare.end());
  }
  if (target == 0) {
    return_segments(segments, shard.stream);
    return;
  }
  target = round_up(target, grain);
  void* base = nullptr;
  try {
    base = exchange_segments(segments, target, shard.stream);
  } catch (const Error&) {
    return;  // an optimisation only: the pool simply holds less now
  }
  if (base == nullptr) return;
  std::lock_guard lock(shard.mutex);
  install_segment(shard, base, target, /*huge=*/false, /*pinned=*/false)->segment->arena = true;
  counters.consolidations.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace sdalloc
