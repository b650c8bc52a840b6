// sdalloc/policies/virtual_memory_pool.hpp - a pool over virtual memory: stitched physical pages.
//
// VirtualMemoryPool carves allocations out of large reserved address ranges (one per stream)
// and maps physical memory into them page by page, only where live
// allocations need it. Address space is plentiful, so the pool never runs out of a
// contiguous place for a request; what it rations is physical memory. When a request lands
// on pages that are not mapped, the pool takes physical chunks, in this order:
//   1. spare chunks (created earlier, unmapped now);
//   2. chunks of pages that lie wholly inside free space, unmapped from where they sit
//      and mapped where the request needs them ("stitching", as GMLake does): free memory
//      split into pieces too small for the request still serves it;
//   3. new chunks from the VirtualMemory, while the physical cap allows.
// Step 2 comes before 3 when remap_before_growth is set (the default): the pool then creates
// a chunk only when no free page is left to move, so its physical footprint follows the
// pages that live allocations touch, not the history of what was cached. See docs/pools.md
// for the policy and its measured costs.
//
// One range per stream, tiled by blocks with best fit, splits, merges and quick lists, the
// same building blocks as CachingPool's (src/pool/pool_shard.hpp). There is no class of
// small requests with ranges of their own: a long-lived small tensor pins at most one page,
// and blocks of every size reuse each other's pages, so a repeated pass lays itself out over
// fewer pages than two classes would each need at their own peaks.
//
// Pages: a page is page_size bytes (a multiple of the VirtualMemory's granularity) at a
// page-aligned offset of its range, backed by one chunk of that size or by nothing. Every
// page that overlaps a live allocation is mapped. Mapped pages stay mapped when their
// allocations are freed (a warm pool makes no system call), unless eager_unmap is set.
//
// Physical cap: max_physical_bytes (0: none) bounds the bytes of chunks the pool holds
// (mapped or spare). This is how a caller simulates a smaller device, or shares one
// (PyTorch's memory fraction); set_capacity changes it at any time, and a cap below what is
// held refuses new chunks until enough are given back (trim, or their pages freed).
//
// Out of memory: when no chunk can be had (the cap, or the VirtualMemory refuses), the pool
// waits for pending cross-stream frees and busy streams, moves every free page it finds in
// any range, and retries; then it throws OutOfMemory stating the request and what was live,
// mapped and free. A request needing more pages than can ever exist (the cap, or the
// VirtualMemory's physical_ceiling(): RAM + swap on the host) is refused at once. A failed
// request changes nothing: chunks it mapped are unmapped again and chunks it created are
// destroyed (the same holds when reserve, create or map throw); a page whose unmap fails
// during that rollback stays mapped under free space, and the original error goes on.
//
// Streams: a block freed on its own stream is reused at once on that stream. A block freed
// on another stream, or named in record_stream() for other streams, waits until those
// streams' events complete (StreamEvents) before its memory counts as free, as in
// CachingPool. A page of stream S's range is moved elsewhere
// only when S is idle (or, on the out-of-memory path, after waiting for S): unmap is given
// S as the stream that last used it.
//
// Thread-safety: every member may be called concurrently. Each range belongs to one shard
// (one stream, one class) with its own lock. The fast path (a quick-list hit, or a best fit
// on pages that are already mapped) takes that lock only, makes no system call and allocates
// no heap memory once warm. Mapping takes a pool-wide lock for the chunk lists.
//
// Errors (all leave the pool unchanged and usable):
//  - OutOfMemory: as above; also sizes above kMaxAllocation. info.reserved is the physical
//    bytes held, info.capacity the cap (or the VirtualMemory's physical capacity).
//  - InvalidArgument: alignment not a power of two or above kMaxAlignment; a deallocate whose
//    byte count differs from the allocation's; bad options (at construction).
//  - InvalidPointer: free of a pointer that is not a live allocation of this pool.
//  - Error: the VirtualMemory failed in a way that is not a lack of memory (the message
//    names the step: reserve, create or map).
//
// Zero bytes: allocate(0) returns nullptr and counts nothing; free(nullptr) does nothing.
// Destruction unmaps and destroys every chunk and releases every range; allocations still
// live become invalid. The VirtualMemory must outlive the pool.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/core/pool.hpp"
#include "sdalloc/core/pool_layout.hpp"
#include "sdalloc/core/pool_stats.hpp"
#include "sdalloc/core/resource.hpp"
#include "sdalloc/core/stream_events.hpp"
#include "sdalloc/core/virtual_memory.hpp"

namespace sdalloc {

struct VirtualMemoryPoolOptions {
  // Bytes of chunks (mapped or spare) the pool may hold at once; 0: no cap of its own (the
  // VirtualMemory's physical capacity still applies).
  std::size_t max_physical_bytes = 0;
  // Bytes per page (and chunk); 0 picks max(granularity, 64 KiB). A power-of-two multiple
  // of the granularity.
  std::size_t page_size = 0;
  // Address space reserved per range (a request larger than this gets a range of its own
  // size). Reserving costs no memory.
  std::size_t range_size = std::size_t{64} << 30;
  // Move free pages to where a request needs them before creating chunks (see above).
  // false: create chunks while the cap allows, move pages only at the cap.
  bool remap_before_growth = true;
  // With remap_before_growth: chunks are still created (instead of pages moved) while the
  // physical bytes stay within this fraction above the highest live bytes seen so far.
  // Moving a page costs system calls; a little slack lets a loop keep its pages where it
  // uses them (docs/pools.md).
  double growth_slack = 0.04;
  // Unmap a page as soon as no allocation uses it (the chunk becomes spare). Lowest mapped
  // footprint, one unmap per freed page and one map per page reused: slow.
  bool eager_unmap = false;
  // Spare chunks are destroyed (given back to the VirtualMemory) instead of kept for reuse.
  bool destroy_spare_chunks = false;
  StreamEvents* stream_events = nullptr;  // nullptr: HostStreamEvents

  // Throws InvalidArgument naming the first bad field.
  void validate(std::size_t granularity) const;
};

// The pool's own figures, beside PoolStats. All byte figures are exact at a quiescent
// moment; peaks are high-water marks since construction or reset_peak().
struct VirtualMemoryPoolStats {
  std::size_t mapped_bytes = 0;  // bytes of pages mapped now
  std::size_t peak_mapped_bytes = 0;
  std::size_t physical_bytes = 0;  // bytes of chunks held: mapped + spare
  std::size_t peak_physical_bytes = 0;
  std::size_t spare_bytes = 0;  // chunks held but not mapped
  std::size_t live_bytes = 0;   // sum of requested sizes of live allocations
  std::size_t peak_live_bytes = 0;
  std::size_t address_space_bytes = 0;  // reserved ranges
  std::size_t ranges = 0;
  std::uint64_t maps = 0;            // VirtualMemory::map calls that succeeded
  std::uint64_t unmaps = 0;          // VirtualMemory::unmap calls
  std::uint64_t moves = 0;           // VirtualMemory::move calls (each moves a run of pages)
  std::uint64_t creates = 0;         // chunks created
  std::uint64_t destroys = 0;        // chunks destroyed
  std::uint64_t remapped_pages = 0;  // pages moved from free space to a request (stitching):
                                     // by move where the memory can, else unmap + map
  std::uint64_t ooms = 0;
};

class VirtualMemoryPool final : public MemoryResource, public PoolLimits {
 public:
  // Reserves nothing yet: the first request of each stream and class reserves its range.
  explicit VirtualMemoryPool(VirtualMemory& memory, VirtualMemoryPoolOptions options = {});
  ~VirtualMemoryPool() override;

  using MemoryResource::allocate;
  // Like allocate(bytes, stream) with a stricter alignment (a power of two <= kMaxAlignment).
  void* allocate(std::size_t bytes, std::size_t alignment, Stream stream);
  // Frees without stating the size. `stream` is where the memory may be reused at once.
  void free(void* ptr, Stream stream = kDefaultStream);
  // The size requested for a live allocation; InvalidPointer if ptr is not one.
  std::size_t allocation_size(const void* ptr) const;
  // Declares that work on `stream` also uses the live allocation ptr (PyTorch's
  // record_stream): its free waits for that stream too. A no-op for the allocation's own
  // stream and for nullptr; InvalidPointer if ptr is not a live allocation.
  void record_stream(void* ptr, Stream stream);

  // Unmaps every page that no allocation uses and destroys every spare chunk; answers the
  // physical bytes given back. Waits for pending cross-stream frees first.
  std::size_t trim();

  // PoolStats view: reserved = physical bytes held (chunks), segments = chunks held,
  // segment allocations / releases = chunks created / destroyed, free = physical - blocks
  // of live allocations; largest_free_block = free_bytes (stitching can join any free pages
  // into one range; partial pages make it an upper bound).
  PoolStats stats() const;
  VirtualMemoryPoolStats vm_stats() const;
  void reset_peak();
  // Where the mapped memory is (core/pool_layout.hpp): one segment per run of mapped pages
  // of a range, with the blocks over it (free blocks cut at the run's ends). Spare chunks are
  // in no segment: the segments add up to the mapped bytes, reserved - spare_bytes.
  PoolLayout layout() const;

  // Checks the pool's invariants (blocks tile their ranges, every page under a live
  // allocation is mapped, chunk counts agree with the figures). Throws Error naming the
  // first broken one. For tests and debugging; takes every lock in turn.
  void check_invariants() const;

  const VirtualMemoryPoolOptions& options() const;
  VirtualMemory& memory() const;
  // The physical cap, else the VirtualMemory's physical capacity (0: unlimited).
  std::size_t capacity() const override;
  // Changes the physical cap (0: none). Thread-safe; what is held stays held.
  void set_capacity(std::size_t max_physical_bytes);
  std::string name() const override;

  struct Impl;

 private:
  void* do_allocate(std::size_t bytes, Stream stream) override;
  void do_deallocate(void* ptr, std::size_t bytes, Stream stream) override;

  std::unique_ptr<Impl> impl_;
};

}  // namespace sdalloc
