// pool_shard.hpp - one stream's part of a stream-ordered pool (internal).
//
// A shard (one per stream, or per stream and class: see stream_ordered_core.hpp) owns the segments
// currently assigned to its stream, their blocks, the index of free blocks, the table of live
// allocations made on the stream, and the blocks freed on other streams that wait for those
// streams' events. Every member function expects the caller to hold `mutex`; a shard never takes
// another shard's lock.
//
// Figures (live bytes, counts) are kept per shard, in plain integers under the shard's
// lock: a pool-wide atomic would bounce one cache line between every thread on every call.
//
// Free blocks live in one of two indexes: `normal` for blocks of ordinary segments and
// `huge` for blocks of segments made for a single huge request. The split matters for
// fragmentation: a normal request never takes a huge block, so a freed 1 GiB buffer stays
// whole for the next 1 GiB request instead of being cut into slivers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "pool/block.hpp"
#include "pool/block_limits.hpp"
#include "pool/block_recycler.hpp"
#include "pool/free_block_index.hpp"
#include "pool/pointer_table.hpp"
#include "pool/quick_lists.hpp"
#include "pool/spin_lock.hpp"
#include "sdalloc/core/stream.hpp"
#include "sdalloc/core/stream_events.hpp"

namespace sdalloc::detail {

// What fits a request: its rounded size plus room to align its start.
struct Fit {
  std::size_t rounded = 0;     // request rounded up to kBlockRounding
  std::size_t alignment = 0;   // a power of two >= kBlockRounding
  std::size_t needed = 0;      // rounded + alignment - kBlockRounding: fits in any such block
  bool huge = false;           // rounded >= huge_threshold
  std::size_t huge_slack = 0;  // a huge block may exceed `needed` by at most this
};

// A block freed on other streams, waiting until their queued work has completed.
struct PendingFree {
  Block* block = nullptr;
  std::vector<StreamEvents::Event> events;
};

// A pool's way to back a carved block before it goes live (VirtualMemoryPool maps pages
// under it). `back` answers false when it cannot now; an exception propagates. Either way
// the shard makes the block free again and nothing else has changed. Taken on the slow
// path only, so a function pointer costs nothing that matters.
class PoolShard;
struct BlockBacking {
  bool (*back)(void* context, PoolShard& shard, Block* block) = nullptr;
  void* context = nullptr;
};

// This shard's share of the pool's figures (see PoolStats for their meaning).
struct ShardFigures {
  std::size_t live_bytes = 0;
  std::size_t peak_live_bytes = 0;
  std::size_t allocated_bytes = 0;
  std::size_t peak_allocated_bytes = 0;
  // The peaks since the pool last set them to the current figures (CachingPool: since a
  // low, and since its last arena; not part of PoolStats).
  std::size_t peak_allocated_since_mark = 0;
  std::size_t peak_reserved_since_mark = 0;
  std::size_t live_allocations = 0;
  std::size_t peak_live_allocations = 0;
  std::uint64_t allocations = 0;
  std::uint64_t frees = 0;
  std::size_t segments = 0;        // segments this shard holds now
  std::size_t reserved_bytes = 0;  // their bytes
  std::size_t peak_reserved_bytes = 0;
  // The highest allocated and reserved bytes since the shard was made: what CachingPool's
  // policy sizes its arena and judges lows by. reset_peak() leaves them: a caller that
  // measures a stretch of work (torch.cuda.reset_peak_memory_stats) must not change what
  // the pool does next.
  std::size_t high_allocated_bytes = 0;
  std::size_t high_reserved_bytes = 0;

  void reset_peak() {
    peak_live_bytes = live_bytes;
    peak_allocated_bytes = allocated_bytes;
    peak_live_allocations = live_allocations;
    peak_reserved_bytes = reserved_bytes;
  }
};

// Pools that keep more per shard derive from it (the core's registry makes shards through
// a hook), hence the virtual destructor: it is never called on a hot path.
class alignas(64) PoolShard {
 public:
  explicit PoolShard(Stream s) : stream(s) {}
  PoolShard(const PoolShard&) = delete;
  PoolShard& operator=(const PoolShard&) = delete;
  virtual ~PoolShard() = default;

  // --- allocation -------------------------------------------------------------------
  // Serves the request from this shard's cached blocks (its quick list, else best fit over
  // all free blocks), or answers nullptr. The hot path.
  Block* allocate(const Fit& fit, std::size_t requested);
  // The same, handing out a best-fit block only if `ready(block, fit)` (VirtualMemoryPool:
  // the pages carve would hand out are mapped). A parked block is always ready (it was
  // live). A template, so the check is inlined into the hot path.
  template <class Ready>
  Block* allocate(const Fit& fit, std::size_t requested, Ready ready);
  // Serves the request from `block`, a free block that fits (a result of find, or a fresh
  // segment's block): carves it and makes the result live.
  Block* allocate_from(Block* block, const Fit& fit, std::size_t requested);
  // The same, letting `backing` back the carved block before it goes live; nullptr (the
  // block free again) when the backing refuses.
  Block* allocate_from(Block* block, const Fit& fit, std::size_t requested,
                       const BlockBacking& backing);
  // The best block for `fit` in the free indexes, or nullptr. Does not change anything.
  Block* find(const Fit& fit) const;

  // --- free -------------------------------------------------------------------------
  Block* find_live(std::uintptr_t addr) const { return live.find(addr); }
  // Ends a live allocation: out of the live table and the figures. The caller then either
  // recycles the block (release) or parks it until other streams are done (pending).
  void forget_live(Block* block);
  // Returns a forgotten block for reuse: parked in a quick list, or merged and indexed.
  void release(Block* block);
  // Makes a block free: merges it with free neighbours and indexes the result.
  void make_free(Block* block);
  // Merges every parked block (see QuickLists) so the indexes show all free memory.
  void drain_quick_lists();
  // Frees every pending block whose events have all completed (polling, or waiting when
  // `wait` is true). Answers whether any block became free.
  bool collect_pending(StreamEvents& events, bool wait);

  // --- segments ---------------------------------------------------------------------
  // Adds a segment (one free block spanning it) and answers that block.
  Block* adopt(Segment* segment, Block* block);
  Block* add_segment(Segment* segment);
  // Unlinks a wholly free segment; its block record goes back to the recycler unless
  // `keep_block` (when the segment moves to another shard with its block).
  void remove_segment(Segment* segment, bool keep_block);
  // A wholly free segment whose block fits `fit`, or nullptr.
  Segment* find_free_segment(const Fit& fit);
  // Wholly free segments that may be returned to the resource (not pinned).
  std::vector<Segment*> releasable_segments();

  // --- figures ----------------------------------------------------------------------
  std::size_t free_bytes() const { return normal.bytes() + huge.bytes() + quick.bytes(); }
  std::size_t largest_free() const;
  std::size_t pending_bytes() const;
  // Checks this shard's invariants; throws sdalloc::Error naming the first broken one.
  // Adds this shard's segment, allocated and requested bytes to the sums given.
  void check(std::size_t& reserved) const;

  FreeBlockIndex& index_of(const Block* block) { return block->segment->huge ? huge : normal; }

  // Takes an indexed free block out of its index, cuts off the alignment padding in front
  // and the unused tail (normal segments only), and answers the block that fits exactly.
  // Needs two spare records (allocate_from reserves them).
  Block* carve(Block* block, const Fit& fit);
  // Records a carved block as a live allocation and counts it.
  Block* make_live(Block* block, std::size_t requested);
  Block* split(Block* block, std::size_t first_size);
  void absorb_next(Block* block);
  // Adds to the shard's reserved bytes and raises their peak.
  void count_reserved(std::size_t bytes);

  mutable SpinLock mutex;
  const Stream stream;
  FreeBlockIndex normal;
  FreeBlockIndex huge;
  QuickLists quick;
  PointerTable live;
  BlockRecycler records;
  Segment* segments = nullptr;  // doubly linked list
  std::vector<PendingFree> pending;
  ShardFigures figures;
};

template <class Ready>
Block* PoolShard::allocate(const Fit& fit, std::size_t requested, Ready ready) {
  if (!fit.huge && fit.alignment == kBlockRounding) {
    live.reserve_one();  // the one step that may allocate, before anything changes
    if (Block* block = quick.pop(fit.rounded)) return make_live(block, requested);
  }
  // Best fit must see every free block, parked ones included.
  drain_quick_lists();
  Block* block = find(fit);
  return block != nullptr && ready(block, fit) ? allocate_from(block, fit, requested) : nullptr;
}

}  // namespace sdalloc::detail
