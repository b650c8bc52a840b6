// sdalloc/policies/caching_pool.hpp - the caching pool: tensors carved from cached segments.
//
// CachingPool takes large segments from an upstream resource and carves allocations out of
// them. Freed blocks stay cached and are handed out again without a system call; address-
// adjacent free blocks are merged, so a segment that empties becomes one block again.
//
// Policy (docs/caching_pool.md has the reasoning and the measurements behind each choice):
//  - Sizes round up to 512 bytes (kRounding); every block is at least 512-byte aligned.
//  - Best fit: the smallest free block that fits, lowest address on ties, found in
//    O(log n) in a tree keyed by (size, address). The rest of the block is split off.
//  - Quick lists: a freed block first waits, unmerged, in a list for its exact size, and
//    the next request of that size takes it back in O(1). A request that misses the lists
//    merges them all before it searches, so best fit always sees every free byte.
//  - Huge requests (>= huge_threshold, 8 MiB) get a segment of their own, and such "huge"
//    blocks are reused only by requests close to their size (within 1/8, or one
//    granularity). Splitting a freed attention buffer or activation for small tensors would
//    strand it: the next request of its size would need a new segment. Normal requests
//    never touch huge blocks. (8 MiB, not the 128 MiB tuned on one trace: on sliced
//    attention, SDXL and small resolutions the large activations are 8-128 MiB, and cut up
//    they cost 1.2-1.7 x live; docs/caching_pool.md has the sweep.)
//  - Growth: a miss takes a new segment of max(round_up(request, segment_granularity),
//    min_segment_size) bytes (round_up(request, small_granularity) while the pool is below
//    small_pool_limit). A huge request's own segment rounds to 1/16 of the request instead
//    (the power of two at or below it, over 16; at least the resource's page_size(), at
//    most the granularity) where the upstream maps pages finer than the granularity (host
//    memory): 2 MiB steps held up to 25 % beyond a request just over 8 MiB, and a resource
//    that does not say its page size (CUDA) keeps the granularity. If a new segment would
//    raise reserved bytes above their previous peak, wholly free segments are first
//    returned to the resource (release_cached_before_growth): the pool's footprint follows
//    what is live instead of what was cached.
//  - Spare pages (keep_spare_pages, where the resource moves pages: can_coalesce()): the
//    segments so released that the new one does not need are kept aside, out of reach of
//    best fit, and the next new segment, or the consolidated arena, takes their pages
//    instead of fresh ones. Without them the arena after the first loop step was largely
//    fresh memory, faulted in again in the second step (SD 1.5's UNet: 210,000 page faults).
//    The pool's decisions (when to release, segment sizes, the arena's size) do not look at
//    them, and what it holds never exceeds the peak its segments reach: spare pages are used
//    up before any fresh page is asked for. trim() and the out-of-memory path return them.
//  - Consolidation: separate segments never merge, so a pool that releases before growing
//    would release and re-take the same memory in every iteration of a loop. When a
//    stream that did so ends the work that churned while it holds two or more segments,
//    its wholly free segments are returned and replaced by one segment of the size the
//    stream needed at its peak, plus 1/16 of what it needed above its floor where the arena
//    cannot grow (consolidate_when_empty; no headroom where it can: "Arena growth" below).
//    The work has ended when the stream is empty (no live allocation), or when it is back at
//    a floor of long-lived blocks (a model's weights, at least half the peak) that it came
//    back to before, with another churn and a rise to the peak in between: a loop step that
//    starts and ends at the same floor. A loop that repeats the same work then runs in one
//    arena with no further growth or release. The swap happens at the stream's next
//    allocation, not at the free that ended the work: that free is often the last one (at
//    exit, or after the user dropped the model), and a new arena then would be taken for
//    nothing.
//  - Arena growth (grow_arena, where the resource can: can_grow(), host memory): a miss in
//    a stream that has an arena grows the arena in place (MemoryResource::grow) by what the
//    request lacks beyond the arena's free tail, in whole pages, before any new segment is
//    taken; the segments released to grow give it their pages. A segment beside the arena
//    never merges with it, so a larger shape after a smaller one (a higher resolution, the
//    VAE decoder after the UNet) held arena and segment for good: 1.55 x live on an
//    ascending sequence of resolutions, 1.05 x with growth (docs/caching_pool.md). Such an
//    arena is made without the 1/16 headroom: best fit's lack is grown once instead (SD
//    1.5's UNet 1.063 -> 1.007 x live).
//  - Free ends (cut_free_ends, where the resource maps pages finer than the segment
//    granularity: host memory): release before growth gives the new segment
//    the pages of wholly free segments, and then, for what they do not cover, the free runs of
//    whole pages at the front or end of segments that still hold live blocks, longest first, each
//    cut off its segment (MemoryResource::split) into a range of its own. Pages a tensor's
//    segment held free beside it no longer sit idle while the pool asks for fresh ones: the
//    recorded UNet traces hold 1.010-1.051 x live instead of 1.010-1.090 x, SDXL's 1.026
//    instead of 1.081; two VAE traces hold more (1.054 -> 1.090, 1.036 -> 1.060;
//    docs/caching_pool.md, "Free ends"). A small pool's first pass made so tight leaves its
//    arena no room for best fit, so below small_pool_limit the arena keeps the 1/16
//    headroom even where it grows, its free ends are cut too (its first arena is often made
//    before the work's large tensors come), and a floor of a few long-lived blocks
//    consolidates it: small image classifiers 1.064-1.093 x live instead of 1.047-1.454,
//    an ONNX Runtime session's ResNet-50 1.080 instead of 1.432; torchvision's ResNet-50
//    1.246 instead of 1.114 (docs/caching_pool.md, "Free ends in small pools").
//    Where an arena would grow by more than 1/16 of the most the pool ever had allocated
//    and its free pages could hold the request, the request stitches instead: every free
//    run of whole pages in the arena, between its live blocks too, is cut out (the arena
//    splits around it) and given to the request's new segment. Best fit leaves a later
//    pass's free bytes in pieces around blocks that outlived their neighbours: the SD 1.5
//    pipeline's VAE decode 1.251 -> 1.001 x live. Such a shape then stitches in every pass
//    (the next consolidation makes the arena whole again): a few system calls a pass. Not
//    in a small pool (docs/caching_pool.md, "Stitching an arena's free pages").
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
  // While the pool's peak reserved bytes (with the request) stay below small_pool_limit,
  // segments and the consolidated arena are multiples of small_granularity (at most
  // segment_granularity) and min_segment_size does not apply: a pool of a few MiB (ResNet-50
  // at batch 1, an ONNX Runtime session's activations) would otherwise hold up to 2 MiB of
  // rounding per segment (1.25 x live on ResNet-50; docs/caching_pool.md). A shard whose
  // highest allocated bytes stay below it is a small pool for "Free ends" above too. 0: off.
  std::size_t small_pool_limit = std::size_t{64} << 20;
  std::size_t small_granularity = std::size_t{128} << 10;
  bool release_cached_before_growth = true;  // see "Growth" above
  bool consolidate_when_empty = true;        // see "Consolidation" above (also at a floor)
  bool keep_spare_pages = true;              // see "Spare pages" above
  bool grow_arena = true;                    // see "Arena growth" above
  bool cut_free_ends = true;                 // see "Free ends" above
  StreamEvents* stream_events = nullptr;     // nullptr: HostStreamEvents

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
