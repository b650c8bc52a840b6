// sdalloc/policies/caching_pool.hpp - the segment cache: tensors carved from cached segments.
//
// CachingPool is the pool for memory that cannot be remapped page by page: cudaMalloc,
// cudaMallocAsync, pinned host memory, memory a caller hands in. It takes whole segments
// from an upstream resource (two functions: allocate, deallocate) and carves allocations out
// of them. Freed blocks stay cached and are handed out again without a system call;
// address-adjacent free blocks merge, so a segment that empties becomes one block again.
// Where memory is virtual (CUDA's cuMem API, host memory, the drop-in's reserved range),
// VirtualMemoryPool is the better pool: it moves free pages under a request, which no
// segment cache can do (docs/pools.md says which pool serves which memory).
//
// Policy, each rule general:
//  - Sizes round up to 512 bytes (kRounding); every block is at least 512-byte aligned.
//  - Best fit: the smallest free block that fits, lowest address on ties, found in
//    O(log n) in a tree keyed by (size, address). The rest of the block is split off.
//  - Quick lists: a freed block first waits, unmerged, in a list for its exact size, and
//    the next request of that size takes it back in O(1). A request that misses the lists
//    merges them all before it searches, so best fit always sees every free byte.
//  - Size classes: a request of at least huge_threshold gets a segment of its own, rounded
//    to the granularity, and such a "huge" block is reused only by a request close to its
//    size (within 1/8 of it, or one granularity). Cutting a freed large buffer for small
//    tensors would strand it: the next request of its size would need a new segment.
//    Smaller requests take segments of max(round_up(request, segment_granularity),
//    min_segment_size) and never touch huge blocks.
//  - Release before growth: if a new segment would raise the bytes the pool holds above
//    their previous peak, its wholly free segments (this stream's, and those of streams
//    that are idle) go back to the resource first, so the footprint follows what is live
//    rather than what was once cached.
//  - Consolidation, the one rule that reshapes memory: separate segments never merge, so a
//    stream that released segments only to take new ones (it "churned") would do so again
//    in every iteration of a loop. Once such a stream's work has gone through a repeated
//    step - it is empty, or its allocated bytes have come back twice to the lowest level they
//    fell to since the churn, each time after rising to the same peak (a step of a loop over
//    long-lived weights or carried state) - its wholly free segments are replaced, at its
//    next allocation, by one arena: the work's peak above what stays live, plus 1/16 of the
//    work for best fit's waste, and, where the same work churned again after an arena, what
//    that arena and the segments taken beside it held at their peak. The next step of the
//    same work runs there with no system call. The swap waits for the next allocation: the
//    free that ended the step may be the last one (at exit), and an arena then would be
//    taken for nothing.
//  - Out of memory: when the resource refuses, the pool waits for pending cross-stream
//    frees, releases every wholly free segment and retries once; then it throws OutOfMemory
//    stating the request, live bytes, reserved bytes, largest free block and capacity.
//  - An initial reservation (initial_reservation > 0) is one segment taken at construction
//    and kept until destruction: trim() and the growth policy never release it.
//
// Streams: each stream has its own shard (lock, free blocks, live pointers). A block freed
// on stream S is reused at once on S. A block freed on S but allocated on T returns to T's
// shard only once the event recorded on S has completed (polled, never waited for, on the
// allocation path). A wholly free segment moves to a shard that misses once the stream
// that last used it is idle. On host memory (HostStreamEvents) every event is complete and
// every stream idle at once.
//
// Thread-safety: all members may be called concurrently. The cache-hit path takes one lock
// (its stream's shard), makes no system call and allocates no heap memory once the pool has
// warmed up (block records and the pointer table are recycled; they grow only when the
// number of blocks reaches a new high).
//
// Errors (all leave the pool unchanged and usable):
//  - OutOfMemory: as above. Also for sizes above kMaxAllocation.
//  - InvalidArgument: alignment not a power of two (0 included) or above kMaxAlignment; a
//    deallocate whose byte count differs from the allocation's; bad options (at
//    construction).
//  - InvalidPointer: free of a pointer that is not a live allocation of this pool (never
//    handed out, freed already, or pointing inside a block).
//
// Zero bytes: allocate(0) returns nullptr and counts nothing; free(nullptr) does nothing.
// Destruction returns every segment to the resource; allocations still live become invalid.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/core/pool.hpp"
#include "sdalloc/core/pool_layout.hpp"
#include "sdalloc/core/pool_stats.hpp"
#include "sdalloc/core/resource.hpp"
#include "sdalloc/core/stream_events.hpp"

namespace sdalloc {

struct CachingPoolOptions {
  std::size_t initial_reservation = 0;                     // bytes taken at construction, kept
  std::size_t segment_granularity = std::size_t{2} << 20;  // segments are multiples of this
  std::size_t min_segment_size = std::size_t{2} << 20;     // smallest segment asked for
  std::size_t huge_threshold = std::size_t{8} << 20;       // requests this big get own blocks
  bool release_cached_before_growth = true;                // see "Release before growth"
  bool consolidate_when_empty = true;                      // see "Consolidation"
  StreamEvents* stream_events = nullptr;                   // nullptr: HostStreamEvents

  // Throws InvalidArgument naming the first bad field: granularity not a power of two of
  // at least 4 KiB, min_segment_size or initial_reservation not a multiple of it, or a
  // huge_threshold below the granularity.
  void validate() const;
};

class CachingPool final : public MemoryResource, public PoolLimits {
 public:
  // The upstream resource (and the stream_events hook, if given) must outlive the pool.
  explicit CachingPool(MemoryResource& upstream, CachingPoolOptions options = {});
  ~CachingPool() override;

  using MemoryResource::allocate;
  // Like allocate(bytes, stream) with a stricter alignment (a power of two <= kMaxAlignment;
  // values up to kRounding cost nothing).
  void* allocate(std::size_t bytes, std::size_t alignment, Stream stream);
  // Frees without stating the size (C API, PyTorch shim). `stream` is where the memory may
  // be reused at once, as in MemoryResource::deallocate.
  void free(void* ptr, Stream stream = kDefaultStream);
  // Declares that work on `stream` also uses the allocation (PyTorch's record_stream): its
  // free then waits for that stream too before the block is reused elsewhere.
  void record_stream(void* ptr, Stream stream);
  // The size requested for a live allocation; InvalidPointer if ptr is not one.
  std::size_t allocation_size(const void* ptr) const;

  // Returns every wholly free segment to the resource (not the initial reservation) and
  // answers how many bytes were released. Waits for pending cross-stream frees first.
  std::size_t trim();

  PoolStats stats() const;
  void reset_peak();
  // Every segment and the blocks tiling it, as of one moment (pool_layout.hpp). Takes every
  // shard's lock for the walk; allocates the answer (std::bad_alloc may escape).
  PoolLayout layout() const;

  // Walks every shard and checks the pool's invariants (blocks tile their segments, free
  // neighbours are merged, indexes and counters agree). Throws Error naming the first
  // broken one. For tests and debugging; takes every lock in turn.
  void check_invariants() const;

  const CachingPoolOptions& options() const;
  MemoryResource& upstream() const;
  std::size_t capacity() const override;
  std::string name() const override;

  struct Impl;

 private:
  void* do_allocate(std::size_t bytes, Stream stream) override;
  void do_deallocate(void* ptr, std::size_t bytes, Stream stream) override;

  std::unique_ptr<Impl> impl_;
};

}  // namespace sdalloc
