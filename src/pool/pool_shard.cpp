// pool_shard.cpp - one stream's blocks: best fit, carving, backing, merging, its segments.
//
// Every function here runs under the shard's mutex (see pool_shard.hpp); none of them
// makes a system call. The only heap allocations are the record recycler's and the
// pointer table's growth, which happen when the shard reaches a new high of blocks.

#include "pool/pool_shard.hpp"

#include <algorithm>
#include <string>

#include "pool/block_limits.hpp"
#include "sdalloc/core/errors.hpp"

namespace sdalloc::detail {

namespace {

std::uintptr_t align_up(std::uintptr_t value, std::size_t alignment) {
  return (value + alignment - 1) & ~(static_cast<std::uintptr_t>(alignment) - 1);
}

[[noreturn]] void broken(const std::string& what) {
  throw Error("CachingPool invariant broken: " + what);
}

}  // namespace

// ---------------------------------------------------------------------------------------
// allocation

Block* PoolShard::allocate(const Fit& fit, std::size_t requested) {
  return allocate(fit, requested, [](const Block*, const Fit&) { return true; });
}

Block* PoolShard::allocate_from(Block* block, const Fit& fit, std::size_t requested) {
  // Make room first so nothing below can fail halfway: at most two new records (front
  // padding, tail) and one live-table entry.
  records.reserve(2);
  live.reserve_one();
  return make_live(carve(block, fit), requested);
}

Block* PoolShard::allocate_from(Block* block, const Fit& fit, std::size_t requested,
                                const BlockBacking& backing) {
  records.reserve(2);
  live.reserve_one();
  Block* carved = carve(block, fit);
  carved->free = false;  // neither indexed nor live: its neighbours will not merge into it
  bool backed = false;
  try {
    backed = backing.back(backing.context, *this, carved);
  } catch (...) {
    make_free(carved);
    throw;
  }
  if (!backed) {
    make_free(carved);
    return nullptr;
  }
  return make_live(carved, requested);
}

Block* PoolShard::make_live(Block* block, std::size_t requested) {
  block->free = false;
  block->requested = requested;
  live.insert(block->addr, block);
  ShardFigures& f = figures;
  ++f.allocations;
  f.live_bytes += requested;
  f.allocated_bytes += block->size;
  ++f.live_allocations;
  if (f.live_bytes > f.peak_live_bytes) f.peak_live_bytes = f.live_bytes;
  if (f.allocated_bytes > f.peak_allocated_bytes) {
    f.peak_allocated_bytes = f.allocated_bytes;
    // The high mark is never below the peak: only a new peak can pass it.
    if (f.allocated_bytes > f.high_allocated_bytes) f.high_allocated_bytes = f.allocated_bytes;
  }
  if (f.allocated_bytes > f.peak_allocated_since_mark) {
    f.peak_allocated_since_mark = f.allocated_bytes;
  }
  if (f.live_allocations > f.peak_live_allocations) f.peak_live_allocations = f.live_allocations;
  return block;
}

Block* PoolShard::find(const Fit& fit) const {
  Block* best = normal.best_fit(fit.needed);
  if (fit.huge) {
    // A huge request may also reuse a huge block, but only one close to its size: a
    // bigger one stays available for the request it was made for.
    Block* candidate = huge.best_fit(fit.needed);
    if (candidate != nullptr && candidate->size <= fit.needed + fit.huge_slack &&
        (best == nullptr || candidate->size < best->size)) {
      best = candidate;
    }
  }
  return best;
}

Block* PoolShard::carve(Block* block, const Fit& fit) {
  index_of(block).erase(block);
  const std::uintptr_t start = align_up(block->addr, fit.alignment);
  if (start != block->addr) {
    Block* aligned = split(block, start - block->addr);
    index_of(block).insert(block);  // the padding stays free
    block = aligned;
  }
  if (!block->segment->huge && block->size - fit.rounded >= kBlockRounding) {
    Block* tail = split(block, fit.rounded);
    index_of(tail).insert(tail);
  }
  if (!block->segment->used) block->segment->used = true;  // no store once set: stays shared
  return block;
}

Block* PoolShard::split(Block* block, std::size_t first_size) {
  Block* rest = records.take();
  rest->addr = block->addr + first_size;
  rest->size = block->size - first_size;
  rest->segment = block->segment;
  rest->prev = block;
  rest->next = block->next;
  rest->free = true;
  if (block->next != nullptr) block->next->prev = rest;
  block->next = rest;
  block->size = first_size;
  return rest;
}

// ---------------------------------------------------------------------------------------
// free

void PoolShard::forget_live(Block* block) {
  live.erase(block->addr);
  ShardFigures& f = figures;
  ++f.frees;
  f.live_bytes -= block->requested;
  f.allocated_bytes -= block->size;
  --f.live_allocations;
  block->requested = 0;
}

void PoolShard::release(Block* block) {
  block->free = true;
  if (block->segment->huge || !quick.push(block)) make_free(block);
}

void PoolShard::drain_quick_lists() {
  quick.drain([this](Block* block) { make_free(block); });
}

void PoolShard::make_free(Block* block) {
  block->free = true;
  block->requested = 0;
  if (block->next != nullptr && block->next->indexed) {
    index_of(block->next).erase(block->next);
    absorb_next(block);
  }
  if (block->prev != nullptr && block->prev->indexed) {
    Block* prev = block->prev;
    index_of(prev).erase(prev);
    absorb_next(prev);
    block = prev;
  }
  index_of(block).insert(block);
}

void PoolShard::absorb_next(Block* block) {
  Block* next = block->next;
  block->size += next->size;
  block->next = next->next;
  if (next->next != nullptr) next->next->prev = block;
  records.give_back(next);
}

bool PoolShard::collect_pending(StreamEvents& events, bool wait) {
  bool any = false;
  auto done = [&](PendingFree& entry) {
    for (StreamEvents::Event e : entry.events) {
      if (wait) {
        events.synchronize(e);
      } else if (!events.query(e)) {
        return false;
      }
    }
    for (StreamEvents::Event e : entry.events) events.release(e);
    make_free(entry.block);
    any = true;
    return true;
  };
  pending.erase(std::remove_if(pending.begin(), pending.end(), done), pending.end());
  return any;
}

// ---------------------------------------------------------------------------------------
// segments

Block* PoolShard::add_segment(Segment* segment) {
  records.reserve(1);
  Block* block = records.take();
  block->addr = segment->base;
  block->size = segment->size;
  block->segment = segment;
  segment->first = block;
  return adopt(segment, block);
}

void PoolShard::count_reserved(std::size_t bytes) {
  figures.reserved_bytes += bytes;
  if (figures.reserved_bytes > figures.peak_reserved_since_mark) {
    figures.peak_reserved_since_mark = figures.reserved_bytes;
  }
  if (figures.reserved_bytes > figures.peak_reserved_bytes) {
    figures.peak_reserved_bytes = figures.reserved_bytes;
    if (figures.reserved_bytes > figures.high_reserved_bytes) {  // never below the peak
      figures.high_reserved_bytes = figures.reserved_bytes;
    }
  }
}

Block* PoolShard::adopt(Segment* segment, Block* block) {
  ++figures.segments;
  count_reserved(segment->size);
  segment->prev = nullptr;
  segment->next = segments;
  if (segments != nullptr) segments->prev = segment;
  segments = segment;
  index_of(block).insert(block);
  return block;
}

void PoolShard::remove_segment(Segment* segment, bool keep_block) {
  --figures.segments;
  figures.reserved_bytes -= segment->size;
  Block* block = segment->first;
  index_of(block).erase(block);
  if (!keep_block) records.give_back(block);
  if (segment->prev != nullptr) segment->prev->next = segment->next;
  if (segment->next != nullptr) segment->next->prev = segment->prev;
  if (segments == segment) segments = segment->next;
  segment->prev = segment->next = nullptr;
}

Segment* PoolShard::find_free_segment(const Fit& fit) {
  drain_quick_lists();
  // Walk the free blocks from the best fit upwards until one spans a whole segment.
  for (Block* b = normal.best_fit(fit.needed); b != nullptr; b = normal.successor(b)) {
    if (b->is_whole_segment()) return b->segment;
  }
  if (fit.huge) {
    for (Block* b = huge.best_fit(fit.needed);
         b != nullptr && b->size <= fit.needed + fit.huge_slack; b = huge.successor(b)) {
      if (b->is_whole_segment()) return b->segment;
    }
  }
  return nullptr;
}

std::vector<Segment*> PoolShard::releasable_segments() {
  drain_quick_lists();
  std::vector<Segment*> result;
  for (Segment* s = segments; s != nullptr; s = s->next) {
    if (!s->pinned && s->first->indexed && s->first->is_whole_segment()) {
      result.push_back(s);
    }
  }
  return result;
}

// ---------------------------------------------------------------------------------------
// figures and checks

std::size_t PoolShard::largest_free() const {
  std::size_t largest = 0;
  if (const Block* b = normal.largest()) largest = b->size;
  if (const Block* b = huge.largest()) largest = std::max(largest, b->size);
  if (quick.bytes() == 0) return largest;
  // Parked blocks merge with their free neighbours only when the lists are drained; the
  // largest block a request would find is the longest run of free blocks in a segment.
  // Walked here rather than drained: draining changes where later blocks go, so a caller
  // polling stats() would steer the pool.
  for (const Segment* s = segments; s != nullptr; s = s->next) {
    std::size_t run = 0;
    for (const Block* b = s->first; b != nullptr; b = b->next) {  // next ends at the segment
      run = b->free ? run + b->size : 0;
      largest = std::max(largest, run);
    }
  }
  return largest;
}

std::size_t PoolShard::pending_bytes() const {
  std::size_t bytes = 0;
  for (const PendingFree& entry : pending) bytes += entry.block->size;
  return bytes;
}

void PoolShard::check(std::size_t& reserved) const {
  std::size_t indexed_blocks = 0;
  std::size_t cached_blocks = 0;
  std::size_t live_blocks = 0;
  std::size_t pending_blocks = 0;
  std::size_t allocated = 0;
  std::size_t requested = 0;
  std::size_t reserved_here = 0;
  std::size_t segment_count = 0;
  for (const Segment* s = segments; s != nullptr; s = s->next) {
    if (s->next != nullptr && s->next->prev != s) broken("segment list links");
    if (s->first == nullptr || s->first->addr != s->base || s->first->prev != nullptr) {
      broken("segment does not start with its first block");
    }
    std::size_t covered = 0;
    for (const Block* b = s->first; b != nullptr; b = b->next) {
      if (b->segment != s) broken("block points to another segment");
      if (b->addr != s->base + covered) broken("blocks do not tile their segment");
      if (b->size == 0 || b->size % kBlockRounding != 0) broken("block size not rounded");
      if (b->next != nullptr && b->next->prev != b) broken("block neighbour links");
      covered += b->size;
      if (b->cached) {
        if (!b->free || b->indexed) broken("parked block also indexed or live");
        ++cached_blocks;
      } else if (b->free) {
        if (!b->indexed) broken("free block missing from the free index");
        if (b->next != nullptr && b->next->indexed) broken("two adjacent free blocks not merged");
        ++indexed_blocks;
      } else if (find_live(b->addr) == b) {
        if (b->indexed) broken("live block in the free index");
        if (b->requested == 0 || b->requested > b->size) broken("live block's requested size");
        allocated += b->size;
        requested += b->requested;
        ++live_blocks;
      } else {
        const bool is_pending = std::any_of(pending.begin(), pending.end(),
                                            [b](const PendingFree& p) { return p.block == b; });
        if (!is_pending) broken("block neither free, parked, live nor pending");
        ++pending_blocks;
      }
    }
    if (covered != s->size) broken("blocks do not cover their segment");
    reserved_here += s->size;
    ++segment_count;
  }
  reserved += reserved_here;
  if (indexed_blocks != normal.count() + huge.count()) broken("free index count");
  if (cached_blocks != quick.count()) broken("quick list count");
  if (live_blocks != live.size()) broken("live table holds blocks outside this shard's segments");
  if (pending_blocks != pending.size()) broken("pending list count");
  if (reserved_here != figures.reserved_bytes) broken("reserved bytes figure");
  if (segment_count != figures.segments) broken("segment count figure");
  if (allocated != figures.allocated_bytes) broken("allocated bytes figure");
  if (requested != figures.live_bytes) broken("live bytes figure");
  if (live_blocks != figures.live_allocations) broken("live allocations figure");
}

}  // namespace sdalloc::detail
