// The model's policy: rounding, best fit, splitting, merging and the release on a failed
// segment allocation (torch_caching_model.hpp). The expandable segments' own steps are in
// torch_expandable_blocks.cpp.
#include "replay/torch_caching_model.hpp"

#include <algorithm>
#include <cstdio>

#include "sdalloc/core/errors.hpp"

namespace sdalloc::replay {
namespace {

// Requests above this cannot be rounded without overflow and exceed any device.
constexpr std::size_t kLargestRequest = std::size_t{1} << 62;
// A VirtualMemory that does not know its physical ceiling is taken as a device this large.
constexpr std::size_t kUnknownDeviceBytes = std::size_t{1} << 40;

std::string pointer_text(const void* ptr) {
  char text[32];
  std::snprintf(text, sizeof text, "%p", ptr);
  return text;
}

TorchCachingOptions checked(TorchCachingOptions options, bool expandable) {
  // PyTorch's max_split_size_mb must be above 20 (kLargeBuffer); so must this.
  if (options.max_split_size <= kTorchLargeBuffer) {
    throw InvalidArgument("torch caching model: max_split_size must be more than 20 MiB, got " +
                          std::to_string(options.max_split_size) + " bytes");
  }
  options.expandable_segments = expandable;
  return options;
}

std::size_t ceil_div(std::size_t bytes, std::size_t unit) { return (bytes + unit - 1) / unit; }

}  // namespace

std::size_t torch_round_size(std::size_t bytes) {
  if (bytes < kTorchMinBlockSize) return kTorchMinBlockSize;
  return kTorchMinBlockSize * ceil_div(bytes, kTorchMinBlockSize);
}

std::size_t torch_segment_size(std::size_t rounded) {
  if (rounded <= kTorchSmallSize) return kTorchSmallBuffer;
  if (rounded < kTorchMinLargeAlloc) return kTorchLargeBuffer;
  return kTorchRoundLarge * ceil_div(rounded, kTorchRoundLarge);
}

TorchCachingModel::TorchCachingModel(MemoryResource& device, TorchCachingOptions options)
    : device_(&device), options_(checked(options, false)) {}

TorchCachingModel::TorchCachingModel(VirtualMemory& vm, TorchCachingOptions options)
    : vm_(&vm), options_(checked(options, true)) {
  device_bytes_ = vm.physical_ceiling() != 0 ? vm.physical_ceiling() : kUnknownDeviceBytes;
  // As PyTorch: address space for 1 1/8 times the device's memory in every range, so pages
  // unmapped early in a range can be mapped again at its end.
  const std::size_t address_space = device_bytes_ + device_bytes_ / 8;
  range_pages_small_ = ceil_div(address_space, kTorchSmallBuffer);
  range_pages_large_ = ceil_div(address_space, kTorchLargeBuffer);
}

TorchCachingModel::~TorchCachingModel() {
  for (const auto& [base, segment] : segments_) {
    try {
      device_->deallocate(const_cast<char*>(base), segment.bytes, Stream(segment.stream));
    } catch (const Error&) {
      // A resource that refuses its own segment back: nothing more can be done here.
    }
  }
  // expandable_ unmaps its pages and releases its ranges as it goes.
}

std::string TorchCachingModel::name() const {
  return options_.expandable_segments ? "torch-expandable(" + vm_->name() + ")"
                                      : "torch-native(" + device_->name() + ")";
}

std::size_t TorchCachingModel::capacity() const {
  return options_.expandable_segments ? vm_->physical_capacity() : device_->capacity();
}

// ---------------------------------------------------------------------------- allocate

void* TorchCachingModel::do_allocate(std::size_t bytes, Stream stream) {
  if (bytes == 0) return nullptr;
  std::lock_guard lock(mutex_);
  if (bytes > kLargestRequest) {
    ++counters_.ooms;
    throw_out_of_memory(bytes);
  }
  Request r;
  r.stream = stream.handle;
  r.size = torch_round_size(bytes);
  r.pool = r.size <= kTorchSmallSize ? &small_blocks_ : &large_blocks_;
  r.segment_bytes = torch_segment_size(r.size);

  // The fast path: a cached block of this stream fits.
  bool found = get_free_block(r);
  if (!found) {
    found = alloc_block(r) || (release_available_cached_blocks(r) && alloc_block(r));
    if (!found) {
      // The only time memory goes back: a segment could not be had.
      ++counters_.cache_releases;
      release_cached_blocks_locked();
      found = alloc_block(r);
    }
  }
  if (!found) {
    ++counters_.ooms;
    throw_out_of_memory(bytes);
  }
  return alloc_found_block(r, bytes)->ptr;
}

bool TorchCachingModel::get_free_block(Request& r) {
  BlockPool& pool = *r.pool;
  Block key;
  key.stream = r.stream;
  key.size = r.size;
  auto it = pool.free.lower_bound(&key);
  if (it == pool.free.end() || (*it)->stream != r.stream) return false;
  if ((*it)->segment != nullptr) {
    // A free block followed by unmapped space can grow into it: for best fit it counts at
    // the size it can reach, so the walk moves on while the next block reaches less.
    auto reach = [](const Block* b) {
      return b->size + (b->next != nullptr && !b->next->mapped ? b->next->size : 0);
    };
    auto next = std::next(it);
    while (next != pool.free.end() && (*next)->stream == r.stream && reach(*next) < reach(*it)) {
      it = next++;
    }
  }
  const std::size_t max_split = options_.max_split_size;
  // A request below max_split_size never takes an oversize block...
  if (r.size < max_split && (*it)->size >= max_split) return false;
  // ...and one above takes it only if less than kLargeBuffer would be wasted.
  if (r.size >= max_split && (*it)->size >= r.size + kTorchLargeBuffer) return false;
  r.block = *it;
  pool.free.erase(it);
  return true;
}

bool TorchCachingModel::should_split(const Block* block, std::size_t size) const {
  const std::size_t remaining = block->size - size;
  if (block->small || options_.expandable_segments) return remaining >= kTorchMinBlockSize;
  return size < options_.max_split_size && remaining > kTorchSmallSize;
}

Block* TorchCachingModel::alloc_found_block(Request& r, std::size_t requested) {
  Block* block = r.block;
  if (should_split(block, r.size)) {
    // The front becomes the allocation; the rest stays free in the pool.
    Block* remaining = block;
    Block front;
    front.stream = r.stream;
    front.size = r.size;
    front.ptr = remaining->ptr;
    front.small = remaining->small;
    front.segment = remaining->segment;
    front.prev = remaining->prev;
    front.next = remaining;
    block = store_.make(front);
    if (block->prev != nullptr) block->prev->next = block;
    remaining->prev = block;
    remaining->ptr += r.size;
    remaining->size -= r.size;
    r.pool->free.insert(remaining);
  }
  block->allocated = true;
  block->requested = requested;
  active_.emplace(block->ptr, block);
  counters_.allocated_bytes += block->size;
  live_requested_ += requested;
  return block;
}

// ---------------------------------------------------------------------------- free

void TorchCachingModel::do_deallocate(void* ptr, std::size_t bytes, Stream /*stream*/) {
  if (ptr == nullptr) return;
  std::lock_guard lock(mutex_);
  const auto it = active_.find(ptr);
  if (it == active_.end()) {
    throw InvalidPointer(
        name() + ": deallocate of " + pointer_text(ptr) + ", which is not a live allocation", ptr);
  }
  Block* block = it->second;
  if (bytes != block->requested) {
    throw InvalidArgument(name() + ": deallocate of " + pointer_text(ptr) + " with " +
                          std::to_string(bytes) + " bytes; it was allocated with " +
                          std::to_string(block->requested));
  }
  active_.erase(it);
  counters_.allocated_bytes -= block->size;
  live_requested_ -= block->requested;
  block->allocated = false;
  block->requested = 0;
  free_block(block);
}

void TorchCachingModel::free_block(Block* block) {
  try_merge_blocks(block, block->prev);
  try_merge_blocks(block, block->next);
  pool_of(*block).free.insert(block);
}

// `dst` must be in no set (its address and size change); `src` leaves its set.
std::size_t TorchCachingModel::try_merge_blocks(Block* dst, Block* src) {
  if (src == nullptr || src->allocated || src->mapped != dst->mapped) return 0;
  if (dst->prev == src) {
    dst->ptr = src->ptr;
    dst->prev = src->prev;
    if (dst->prev != nullptr) dst->prev->next = dst;
  } else {
    dst->next = src->next;
    if (dst->next != nullptr) dst->next->prev = dst;
  }
  const std::size_t subsumed = src->size;
  dst->size += subsumed;
  BlockPool& pool = pool_of(*src);
  if (src->mapped) {
    pool.free.erase(src);
  } else {
    pool.unmapped.erase(src);
  }
  store_.drop(src);
  return subsumed;
}

// ---------------------------------------------------------------------------- segments

bool TorchCachingModel::alloc_block(Request& r) {
  if (options_.expandable_segments) {
    r.block = try_allocate_expandable_block(r);
    return r.block != nullptr;
  }
  void* base = nullptr;
  try {
    base = device_->allocate(r.segment_bytes, Stream(r.stream));
  } catch (const OutOfMemory&) {
    return false;  // cudaMalloc's cudaErrorMemoryAllocation
  }
  if (base == nullptr) return false;
  segments_.emplace(static_cast<const char*>(base), SegmentRecord{r.segment_bytes, r.stream});
  ++counters_.segment_allocations;
  note_reserved(r.segment_bytes);
  Block segment;
  segment.stream = r.stream;
  segment.size = r.segment_bytes;
  segment.ptr = static_cast<char*>(base);
  segment.small = r.pool->small;
  r.block = store_.make(segment);
  return true;
}

// Only with max_split_size: frees the cached oversize segments of the request's stream and
// pool, the smallest single one that is large enough, or else the largest ones until
// enough is free (never with expandable segments: see the header).
bool TorchCachingModel::release_available_cached_blocks(const Request& r) {
  if (options_.expandable_segments ||
      options_.max_split_size == TorchCachingOptions::kNoMaxSplitSize) {
    return false;
  }
  BlockPool& pool = *r.pool;
  Block key;
  key.stream = r.stream;
  key.size = std::max(r.size, options_.max_split_size);
  auto it = pool.free.lower_bound(&key);
  if (it != pool.free.end() && (*it)->stream == r.stream) {
    release_block(*it);
    return true;
  }
  if (it == pool.free.begin()) return false;
  std::size_t released = 0;
  --it;  // the largest block of the stream, if any
  while (released < key.size && (*it)->size >= options_.max_split_size &&
         (*it)->stream == r.stream) {
    const auto current = it;
    released += (*it)->size;
    const bool first = it == pool.free.begin();
    if (!first) --it;
    release_block(*current);
    if (first) break;
  }
  return released >= key.size;
}

void TorchCachingModel::release_cached_blocks() {
  std::lock_guard lock(mutex_);
  release_cached_blocks_locked();
}

void TorchCachingModel::release_cached_blocks_locked() {
  release_blocks(large_blocks_);
  release_blocks(small_blocks_);
}

void TorchCachingModel::release_blocks(BlockPool& pool) {
  if (options_.expandable_segments) {
    release_expandable_blocks(pool);
    return;
  }
  for (auto it = pool.free.begin(); it != pool.free.end();) {
    Block* block = *it;
    ++it;
    if (!block->is_split()) release_block(block);
  }
}

// Gives a wholly free, unsplit segment back to the device (cudaFree).
void TorchCachingModel::release_block(Block* block) {
  if (block->is_split()) throw Error(name() + ": internal error: release of a split block");
  pool_of(*block).free.erase(block);
  segments_.erase(block->ptr);
  counters_.reserved_bytes -= block->size;
  ++counters_.segment_releases;
  void* const base = block->ptr;
  const std::size_t bytes = block->size;
  const Stream stream(block->stream);
  store_.drop(block);
  device_->deallocate(base, bytes, stream);
}

void TorchCachingModel::note_reserved(std::size_t added) {
  counters_.reserved_bytes += added;
  counters_.peak_reserved_bytes = std::max(counters_.peak_reserved_bytes, counters_.reserved_bytes);
}

// ---------------------------------------------------------------------------- reports

void TorchCachingModel::throw_out_of_memory(std::size_t bytes) const {
  OutOfMemoryInfo info;
  info.requested = bytes;
  info.live = live_requested_;
  info.reserved = counters_.reserved_bytes;
  for (const BlockPool* pool : {&small_blocks_, &large_blocks_}) {
    for (const Block* block : pool->free)
      info.largest_free = std::max(info.largest_free, block->size);
  }
  info.capacity = capacity();
  throw OutOfMemory::describe(name(), info,
                              "after releasing " + std::to_string(counters_.segment_releases) +
                                  " cached segments so far, as PyTorch's allocator would");
}

TorchCachingCounters TorchCachingModel::counters() const {
  std::lock_guard lock(mutex_);
  return counters_;
}

std::size_t TorchCachingModel::block_bytes(const void* ptr) const {
  std::lock_guard lock(mutex_);
  const auto it = active_.find(ptr);
  return it == active_.end() ? 0 : it->second->size;
}

std::vector<TorchSegmentView> TorchCachingModel::snapshot() const {
  std::lock_guard lock(mutex_);
  std::vector<const Block*> blocks;
  for (const BlockPool* pool : {&small_blocks_, &large_blocks_}) {
    blocks.insert(blocks.end(), pool->free.begin(), pool->free.end());
  }
  for (const auto& entry : active_) blocks.push_back(entry.second);
  std::vector<TorchSegmentView> views;
  for (const Block* head : blocks) {
    // A segment, or one mapped stretch of an expandable range.
    if (head->prev != nullptr && head->prev->mapped) continue;
    TorchSegmentView view;
    view.stream = head->stream;
    view.small = head->small;
    view.base = head->ptr;
    for (const Block* b = head; b != nullptr && b->mapped; b = b->next) {
      view.bytes += b->size;
      view.block_sizes.push_back(b->size);
      view.block_allocated.push_back(b->allocated);
    }
    views.push_back(std::move(view));
  }
  std::sort(views.begin(), views.end(),
            [](const TorchSegmentView& a, const TorchSegmentView& b) { return a.base < b.base; });
  return views;
}

}  // namespace sdalloc::replay
