// policies/planned_arena/recording_blocks.cpp - upstream blocks of a recording step, and
// the cache that keeps them within the step's live peak.
#include "policies/planned_arena/recording_blocks.hpp"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <new>
#include <string>

#include "core/bits.hpp"
#include "sdalloc/core/errors.hpp"

namespace sdalloc::planned_arena_detail {

RecordingBlocks::~RecordingBlocks() {
  for (const auto& [p, b] : live_) release_raw(b.raw, b.raw_bytes, b.stream);
  release_cache();
}

// ---- serving and freeing ----------------------------------------------------------------

void* RecordingBlocks::allocate(std::size_t bytes, std::size_t rounded, std::size_t alignment,
                                Stream stream) {
  // The upstream guarantees kMinAlignment; a stricter alignment takes slack to align up.
  const std::size_t raw_bytes =
      rounded + (alignment > kMinAlignment ? alignment - kMinAlignment : 0);
  void* raw = nullptr;
  if (const auto cached = cache_.find(raw_bytes); cached != cache_.end()) {
    raw = cached->second.raw;
    cache_.erase(cached);
  } else {
    make_room(raw_bytes);
    try {
      raw = upstream_.allocate(raw_bytes, stream);
    } catch (const OutOfMemory&) {
      if (cache_.empty()) throw;
      release_cache();  // all of it, then once more
      raw = upstream_.allocate(raw_bytes, stream);
    }
    ++figures_.upstream_allocations;
    figures_.held_bytes += raw_bytes;
  }
  void* p = reinterpret_cast<void*>(round_up(reinterpret_cast<std::uintptr_t>(raw), alignment));
  try {
    live_.emplace(p, Block{raw, raw_bytes, rounded, bytes, stream});
  } catch (...) {
    release_raw(raw, raw_bytes, stream);
    throw;
  }
  figures_.live_raw_bytes += raw_bytes;
  figures_.live_rounded_bytes += rounded;
  figures_.live_bytes += bytes;
  ++figures_.allocations;
  note_peaks();
  return p;
}

std::optional<std::size_t> RecordingBlocks::requested_size(const void* p) const {
  const auto it = live_.find(const_cast<void*>(p));
  if (it == live_.end()) return std::nullopt;
  return it->second.requested;
}

void RecordingBlocks::free(void* p, bool cache) {
  const auto it = live_.find(p);
  const Block b = it->second;
  live_.erase(it);
  figures_.live_raw_bytes -= b.raw_bytes;
  figures_.live_rounded_bytes -= b.rounded;
  figures_.live_bytes -= b.requested;
  ++figures_.frees;
  if (cache) {
    try {
      cache_.emplace(b.raw_bytes, Cached{b.raw, b.stream});
      return;
    } catch (const std::bad_alloc&) {  // no node for the cache: give the block back
    }
  }
  release_raw(b.raw, b.raw_bytes, b.stream);
}

// ---- the cache --------------------------------------------------------------------------

// Returns cached blocks, largest first, until `need` more bytes keep what is held within
// the most that was (or is about to be) live.
void RecordingBlocks::make_room(std::size_t need) {
  const std::size_t bound = std::max(figures_.peak_live_raw_bytes, figures_.live_raw_bytes + need);
  while (figures_.held_bytes + need > bound && !cache_.empty()) {
    const auto largest = std::prev(cache_.end());
    const auto [raw_bytes, cached] = *largest;
    cache_.erase(largest);
    release_raw(cached.raw, raw_bytes, cached.stream);
  }
}

void RecordingBlocks::release_cache() {
  for (const auto& [raw_bytes, cached] : cache_) release_raw(cached.raw, raw_bytes, cached.stream);
  cache_.clear();
}

// Cannot fail: a block the upstream refuses to take back is left to it (counted), so a
// failed deallocate never leaves these books half-updated nor fails the request that
// released it (a recording step gives cached blocks back before it asks for more).
void RecordingBlocks::release_raw(void* raw, std::size_t raw_bytes, Stream stream) noexcept {
  figures_.held_bytes -= raw_bytes;
  try {
    upstream_.deallocate(raw, raw_bytes, stream);
    ++figures_.upstream_releases;
  } catch (...) {
    ++figures_.failed_releases;
  }
}

// ---- figures and layout -----------------------------------------------------------------

void RecordingBlocks::note_peaks() {
  RecordingBlockFigures& f = figures_;
  f.peak_live_raw_bytes = std::max(f.peak_live_raw_bytes, f.live_raw_bytes);
}

RecordingBlockFigures RecordingBlocks::figures() const {
  RecordingBlockFigures f = figures_;
  f.live_blocks = live_.size();
  f.blocks = live_.size() + cache_.size();
  return f;
}

void RecordingBlocks::add_layout(PoolLayout& layout) const {
  for (const auto& [p, b] : live_) {
    SegmentLayout segment;
    segment.address = reinterpret_cast<std::uintptr_t>(b.raw);
    segment.size = b.raw_bytes;
    segment.stream = b.stream;
    const auto start = reinterpret_cast<std::uintptr_t>(p);
    const std::uintptr_t end = segment.address + segment.size;
    if (start > segment.address) {
      segment.blocks.push_back({segment.address, start - segment.address, 0, BlockState::kFree});
    }
    segment.blocks.push_back({start, b.rounded, b.requested, BlockState::kLive});
    if (end > start + b.rounded) {
      segment.blocks.push_back({start + b.rounded, end - start - b.rounded, 0, BlockState::kFree});
    }
    layout.segments.push_back(std::move(segment));
  }
  for (const auto& [raw_bytes, cached] : cache_) {
    SegmentLayout segment;
    segment.address = reinterpret_cast<std::uintptr_t>(cached.raw);
    segment.size = raw_bytes;
    segment.stream = cached.stream;
    segment.blocks.push_back({segment.address, raw_bytes, 0, BlockState::kFree});
    layout.segments.push_back(std::move(segment));
  }
}

void RecordingBlocks::check_invariants() const {
  const auto broken = [](const char* what) {
    throw Error(std::string("PlannedArena invariant broken: recording blocks: ") + what);
  };
  std::size_t raw = 0;
  std::size_t rounded = 0;
  std::size_t requested = 0;
  for (const auto& [ptr, block] : live_) {
    if (block.rounded < block.requested) broken("a block hands out less than was asked");
    raw += block.raw_bytes;
    rounded += block.rounded;
    requested += block.requested;
  }
  std::size_t cached = 0;
  for (const auto& [raw_bytes, block] : cache_) cached += raw_bytes;
  if (raw != figures_.live_raw_bytes) broken("live raw bytes disagree with the blocks");
  if (rounded != figures_.live_rounded_bytes) broken("live rounded bytes disagree");
  if (requested != figures_.live_bytes) broken("live bytes disagree with the blocks");
  if (raw + cached != figures_.held_bytes) broken("held bytes disagree with the blocks");
}

}  // namespace sdalloc::planned_arena_detail
