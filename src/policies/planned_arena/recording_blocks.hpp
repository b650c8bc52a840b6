// policies/planned_arena/recording_blocks.hpp - the recording step's blocks, taken straight
// from the upstream (PlannedArenaOptions::record_through_upstream).
//
// A recording step must not hold a pool's cache beside what it has live, or the arena
// planned from it would be reserved beside that cache. So its plan-stream allocations are
// blocks of the upstream itself. A block freed during the recording is cached for a later
// request of exactly its raw size (a step repeats its sizes, and a reused block is not
// faulted in again); before the upstream is asked for more, cached blocks (largest first)
// go back until what is held is no more than the most that was live at once. A block may
// outlive its step (kept state); freed outside a recording step it goes straight back.
//
// Invariants: figures_.held_bytes = raw bytes of live_ and cache_; held_bytes never
// exceeds max(peak_live_raw_bytes, live_raw_bytes) after an allocation makes room; a block
// is handed out as [p, p + rounded) inside [raw, raw + raw_bytes), p aligned as asked. The
// destructor gives every block back. Not thread-safe: PlannedArena's mutex guards it.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <unordered_map>

#include "policies/planned_arena/figures.hpp"
#include "sdalloc/core/pool_layout.hpp"
#include "sdalloc/core/resource.hpp"
#include "sdalloc/core/stream.hpp"

namespace sdalloc::planned_arena_detail {

class RecordingBlocks {
 public:
  explicit RecordingBlocks(MemoryResource& upstream) : upstream_(upstream) {}
  ~RecordingBlocks();
  RecordingBlocks(const RecordingBlocks&) = delete;
  RecordingBlocks& operator=(const RecordingBlocks&) = delete;

  // A block for `bytes` (rounded up to `rounded`) at `alignment` on `stream`: a cached
  // block of the same raw size, or a new one from the upstream. Throws OutOfMemory when the
  // upstream refuses even after the whole cache went back.
  void* allocate(std::size_t bytes, std::size_t rounded, std::size_t alignment, Stream stream);
  // The bytes asked for by the live block p; nullopt when p is none.
  std::optional<std::size_t> requested_size(const void* p) const;
  // Frees the live block p (requested_size(p) has a value): cached when `cache`, else given
  // back to the upstream.
  void free(void* p, bool cache);
  // Gives every cached block back (the recording ended, or the upstream is short).
  void release_cache();

  RecordingBlockFigures figures() const;
  // Each block as a segment of its own: a live block with its slack as free blocks, a
  // cached one as one free block.
  void add_layout(PoolLayout& layout) const;
  // The figures' current values agree with the live and cached blocks; throws Error.
  void check_invariants() const;

 private:
  struct Block {
    void* raw = nullptr;        // what the upstream returned
    std::size_t raw_bytes = 0;  // what was asked of the upstream
    std::size_t rounded = 0;    // the block handed out: [pointer, pointer + rounded)
    std::size_t requested = 0;  // what the caller asked for
    Stream stream;              // the plan stream it was taken on
  };
  struct Cached {
    void* raw;
    Stream stream;
  };

  void make_room(std::size_t need);
  void release_raw(void* raw, std::size_t raw_bytes, Stream stream) noexcept;
  void note_peaks();

  MemoryResource& upstream_;
  std::unordered_map<void*, Block> live_;     // by the pointer handed out
  std::multimap<std::size_t, Cached> cache_;  // by raw bytes
  RecordingBlockFigures figures_;             // live_blocks and blocks: see figures()
};

}  // namespace sdalloc::planned_arena_detail
