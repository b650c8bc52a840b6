// The model's expandable segments (torch_caching_model.hpp): where a request that no free
// block fits is placed in a stream's range, how the pages it lacks are mapped and merged
// with the free block before them, and how release unmaps the pages lying wholly inside
// free blocks and gives back a range left with no mapped page. As in PyTorch, each range
// is a list of blocks in address order: mapped ones (free or allocated) and unmapped ones,
// and the range always ends in an unmapped block until it is mapped to its very end.
#include <algorithm>
#include <memory>

#include "replay/torch_caching_model.hpp"

namespace sdalloc::replay {
namespace {

// Links `block` into a range's list between `before` and `after` (either may be null).
void splice(Block* block, Block* before, Block* after) {
  block->prev = before;
  block->next = after;
  if (before != nullptr) before->next = block;
  if (after != nullptr) after->prev = block;
}

}  // namespace

// The lowest place in the stream's ranges where free and unmapped blocks together hold
// r.size: the first unmapped block (in address order) that, with the free block just
// before it and the free or unmapped ones after it, is large enough. A new range when none
// is; nullptr when even a whole range is too small.
Block* TorchCachingModel::find_expandable_block(Request& r) {
  BlockPool& pool = *r.pool;
  auto allocatable = [](const Block* b) { return b != nullptr && !b->allocated; };
  auto has_room = [&](const Block* b) {
    std::size_t bytes = 0;
    for (; bytes < r.size && allocatable(b); b = b->next) bytes += b->size;
    return bytes >= r.size;
  };
  Block key;
  key.stream = r.stream;
  for (auto it = pool.unmapped.lower_bound(&key);
       it != pool.unmapped.end() && (*it)->stream == r.stream; ++it) {
    Block* candidate = *it;
    if (allocatable(candidate->prev)) candidate = candidate->prev;
    if (has_room(candidate)) return candidate;
  }
  const std::size_t page = pool.small ? kTorchSmallBuffer : kTorchLargeBuffer;
  const std::size_t pages = pool.small ? range_pages_small_ : range_pages_large_;
  if (r.size > page * pages) return nullptr;
  auto segment = std::make_unique<ExpandableSegment>(*vm_, Stream(r.stream), page, pages);
  Block whole;
  whole.stream = r.stream;
  whole.size = segment->bytes();
  whole.ptr = segment->base();
  whole.small = pool.small;
  whole.mapped = false;
  whole.segment = segment.get();
  expandable_.push_back(std::move(segment));
  ++counters_.ranges;
  Block* candidate = store_.make(whole);
  pool.unmapped.insert(candidate);
  return candidate;
}

// Maps the pages that cover the first `size` bytes of the unmapped block `to_map`; what is
// mapped becomes one free block with its free neighbours. False, nothing changed, when the
// device has no memory for them.
bool TorchCachingModel::map_block(Block* to_map, std::size_t size) {
  ExpandableSegment& segment = *to_map->segment;
  const std::size_t page = segment.page_bytes();
  const std::size_t wanted = (size + page - 1) / page * page;
  if (wanted > device_bytes_ - std::min(device_bytes_, counters_.reserved_bytes)) return false;
  const std::size_t mapped = segment.map(to_map->ptr, size);
  if (mapped == 0) return false;

  BlockPool& pool = pool_of(*to_map);
  pool.unmapped.erase(to_map);
  to_map->mapped = true;
  if (mapped < to_map->size) {
    Block rest;
    rest.stream = to_map->stream;
    rest.size = to_map->size - mapped;
    rest.ptr = to_map->ptr + mapped;
    rest.small = to_map->small;
    rest.mapped = false;
    rest.segment = to_map->segment;
    Block* remaining = store_.make(rest);
    splice(remaining, to_map, to_map->next);
    pool.unmapped.insert(remaining);
    to_map->size = mapped;
  }
  try_merge_blocks(to_map, to_map->prev);
  try_merge_blocks(to_map, to_map->next);
  pool.free.insert(to_map);

  note_reserved(mapped);
  ++counters_.segment_allocations;
  counters_.pages_mapped += mapped / page;
  return true;
}

// Maps what the request lacks at the place find_expandable_block chose and answers the
// free block, taken out of the pool, that now holds it; nullptr when memory ran out (the
// pages mapped before that stay mapped, free, as in PyTorch).
Block* TorchCachingModel::try_allocate_expandable_block(Request& r) {
  Block* candidate = find_expandable_block(r);
  if (candidate == nullptr) return nullptr;
  if (!candidate->mapped && !map_block(candidate, std::min(candidate->size, r.size))) {
    return nullptr;
  }
  while (candidate->size < r.size) {
    // candidate is free and mapped, its next block unmapped: map some of it.
    Block* next = candidate->next;
    if (!map_block(next, std::min(r.size - candidate->size, next->size))) return nullptr;
    candidate = next;  // map_block merged the two into `next`
  }
  r.pool->free.erase(candidate);
  return candidate;
}

// Unmaps the pages lying wholly inside the free block; the parts of pages at its ends stay
// mapped, as free blocks of their own.
void TorchCachingModel::unmap_block(Block* block) {
  ExpandableSegment& segment = *block->segment;
  const PageStretch unmapped = segment.unmap(block->ptr, block->size);
  if (unmapped.bytes == 0) return;
  BlockPool& pool = pool_of(*block);
  pool.free.erase(block);

  const auto before = static_cast<std::size_t>(unmapped.ptr - block->ptr);
  const std::size_t after = block->size - before - unmapped.bytes;
  Block piece;
  piece.stream = block->stream;
  piece.small = block->small;
  piece.segment = block->segment;
  if (before > 0) {
    piece.size = before;
    piece.ptr = block->ptr;
    Block* front = store_.make(piece);
    splice(front, block->prev, block);
    pool.free.insert(front);
  }
  if (after > 0) {
    piece.size = after;
    piece.ptr = unmapped.ptr + unmapped.bytes;
    Block* back = store_.make(piece);
    splice(back, block, block->next);
    pool.free.insert(back);
  }
  block->ptr = unmapped.ptr;
  block->size = unmapped.bytes;
  block->mapped = false;
  try_merge_blocks(block, block->prev);
  try_merge_blocks(block, block->next);
  pool.unmapped.insert(block);

  counters_.reserved_bytes -= unmapped.bytes;
  ++counters_.segment_releases;
  counters_.pages_unmapped += unmapped.bytes / segment.page_bytes();
}

// The range of `block`, wholly unmapped, goes back (its address space is released).
void TorchCachingModel::release_expandable_segment(Block* block) {
  pool_of(*block).unmapped.erase(block);
  const auto it = std::find_if(expandable_.begin(), expandable_.end(),
                               [block](const auto& s) { return s.get() == block->segment; });
  expandable_.erase(it);
  store_.drop(block);
  ++counters_.ranges_released;
}

void TorchCachingModel::release_expandable_blocks(BlockPool& pool) {
  // Unmapping changes the free set; the blocks to unmap are gathered first. A block that
  // another's unmapping merges away is always one handled before it: free mapped blocks are
  // never neighbours, and an unmapped block merges only with unmapped ones.
  const std::vector<Block*> to_unmap(pool.free.begin(), pool.free.end());
  for (Block* block : to_unmap) {
    unmap_block(block);
    if (!block->mapped && !block->is_split()) release_expandable_segment(block);
  }
}

}  // namespace sdalloc::replay
