// tools/sdalloc/replay/torch_caching_model.hpp - PyTorch's CUDA caching allocator, as a model.
//
// TorchCachingModel follows the policy of PyTorch's native CUDA caching allocator
// (c10/cuda/CUDACachingAllocator.cpp, DeviceCachingAllocator), so `sdalloc replay` shows
// what PyTorch itself would hold for a trace, on any machine. It is a real allocator: the
// memory it hands out lies in segments of a MemoryResource (cudaMalloc's place) or in the
// pages of a VirtualMemory (cuMemCreate and cuMemMap's place, expandable segments), and may
// be written.
//
// The rules it follows:
//  - Sizes round up to a multiple of 512 B (kMinBlockSize). Requests of at most 1 MiB
//    (kSmallSize) are served from the small pool, larger ones from the large pool.
//  - A request no free block fits gets a new segment: 2 MiB (kSmallBuffer) for the small
//    pool, 20 MiB (kLargeBuffer) for requests under 10 MiB (kMinLargeAlloc), else the
//    request rounded up to 2 MiB (kRoundLarge).
//  - Best fit inside a pool by (stream, size, address): the smallest free block of the
//    request's stream that fits. A block freed on one stream is reused only on that stream.
//  - Split: a small-pool block when at least 512 B would remain; a large-pool block when more
//    than 1 MiB would remain and the request is below max_split_size (with expandable
//    segments: at least 512 B remain, in both pools).
//  - max_split_size (default: none): a request below it never takes a free block of at
//    least max_split_size; a request of at least max_split_size takes such a block only if
//    the block is less than the request + 20 MiB (kLargeBuffer). Before releasing all
//    cached segments on a failed segment allocation, the free oversize segments are released
//    first, only as many as the request needs (release_available_cached_blocks).
//  - A freed block merges with its free neighbours of the same segment only.
//  - Memory goes back only when a segment allocation fails: then every cached segment that
//    is wholly free and unsplit is released (release_cached_blocks, also empty_cache()) and
//    the allocation is tried once more; if that fails too, OutOfMemory.
//  - Expandable segments (options.expandable_segments): instead of segments, one range of
//    address space per (stream, pool), 1 1/8 times the device's memory, in pages of 2 MiB
//    (small pool) or 20 MiB (large pool). A request no free block fits is placed at the
//    lowest address of the stream's ranges where free and unmapped space together fit it
//    (normally the free block at the end of the mapped part); just the pages it lacks are
//    mapped there, merging with that free block. Best fit counts a free block followed by
//    unmapped space at its size plus that space, so such blocks are taken last. Release
//    unmaps the pages lying wholly inside free blocks, and a range left with no mapped
//    page is given back.
//
// Left out: roundup_power2_divisions (sizes are rounded to 512 B only),
// garbage_collection_threshold and set_per_process_memory_fraction (the cap is the
// resource's capacity, or the VirtualMemory's physical ceiling), CUDA graph private pools,
// record_stream and its events (a block is free once deallocate returns), the free-memory
// callbacks, expandable segments switched on and off during a run, release_available_
// cached_blocks with expandable segments (PyTorch would release an expandable block there
// as if it were a segment), IPC sharing, statistics and history beyond the counters below.
//
// Streams: deallocate's stream is ignored; a block goes back to the pool of the stream it
// was allocated on (PyTorch keeps the allocation stream). Thread-safe: one mutex, as
// PyTorch's allocator takes one per device on every call.
// Errors: OutOfMemory when the request cannot be met after the release (every live block
// stays intact; the cache has been released, as PyTorch's is); InvalidPointer for a pointer
// that is not a live allocation and InvalidArgument for a size that is not the one
// allocated (nothing freed); InvalidArgument for a max_split_size of 20 MiB or less, which
// PyTorch refuses too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "replay/torch_block_pool.hpp"
#include "replay/torch_expandable_segment.hpp"
#include "sdalloc/core/resource.hpp"
#include "sdalloc/core/virtual_memory.hpp"

namespace sdalloc::replay {

inline constexpr std::size_t kTorchMinBlockSize = 512;
inline constexpr std::size_t kTorchSmallSize = std::size_t{1} << 20;
inline constexpr std::size_t kTorchSmallBuffer = std::size_t{2} << 20;
inline constexpr std::size_t kTorchMinLargeAlloc = std::size_t{10} << 20;
inline constexpr std::size_t kTorchLargeBuffer = std::size_t{20} << 20;
inline constexpr std::size_t kTorchRoundLarge = std::size_t{2} << 20;

// PyTorch's round_size without roundup_power2_divisions: at least 512 B, a multiple of it.
std::size_t torch_round_size(std::size_t bytes);
// PyTorch's get_allocation_size: the segment a rounded request gets when nothing fits.
std::size_t torch_segment_size(std::size_t rounded);

struct TorchCachingOptions {
  static constexpr std::size_t kNoMaxSplitSize = std::numeric_limits<std::size_t>::max();
  std::size_t max_split_size = kNoMaxSplitSize;  // bytes; more than 20 MiB, or none
  bool expandable_segments = false;
};

struct TorchCachingCounters {
  std::uint64_t segment_allocations = 0;  // segments taken (expandable: stretches mapped)
  std::uint64_t segment_releases = 0;     // segments released (expandable: stretches unmapped)
  std::uint64_t pages_mapped = 0;         // expandable: pages created and mapped
  std::uint64_t pages_unmapped = 0;
  std::uint64_t ranges = 0;  // expandable: ranges reserved
  std::uint64_t ranges_released = 0;
  std::uint64_t cache_releases = 0;  // release_cached_blocks after a failed allocation
  std::uint64_t ooms = 0;            // requests refused after it
  std::size_t reserved_bytes = 0;    // segments held, or pages mapped
  std::size_t peak_reserved_bytes = 0;
  std::size_t allocated_bytes = 0;  // rounded sizes of the blocks handed out
};

// One contiguous mapped stretch of memory and its blocks, in address order, as PyTorch's
// memory snapshot shows a segment; for tests and diagnostics.
struct TorchSegmentView {
  std::uintptr_t stream = 0;
  bool small = false;
  const char* base = nullptr;
  std::size_t bytes = 0;
  std::vector<std::size_t> block_sizes;
  std::vector<bool> block_allocated;
};

class TorchCachingModel final : public MemoryResource {
 public:
  // Native: segments are allocated from `device` (deallocate gives them back).
  explicit TorchCachingModel(MemoryResource& device, TorchCachingOptions options = {});
  // Expandable segments (options.expandable_segments is taken as true): pages are created
  // and mapped in `vm`; its physical_ceiling() is the device's memory (0: 1 TiB).
  TorchCachingModel(VirtualMemory& vm, TorchCachingOptions options);
  ~TorchCachingModel() override;  // gives every segment back, live blocks or not

  // PyTorch's empty_cache(): releases what release_cached_blocks releases.
  void release_cached_blocks();
  TorchCachingCounters counters() const;
  std::vector<TorchSegmentView> snapshot() const;
  // The size of the block that holds the live allocation at ptr (its rounded size, or more
  // when the block was not split); 0 when ptr is not a live allocation.
  std::size_t block_bytes(const void* ptr) const;

  std::string name() const override;
  std::size_t capacity() const override;

 private:
  struct Request {
    std::uintptr_t stream = 0;
    std::size_t size = 0;  // rounded
    BlockPool* pool = nullptr;
    std::size_t segment_bytes = 0;
    Block* block = nullptr;
  };

  void* do_allocate(std::size_t bytes, Stream stream) override;
  void do_deallocate(void* ptr, std::size_t bytes, Stream stream) override;

  // Policy (torch_caching_model.cpp).
  bool get_free_block(Request& r);
  bool should_split(const Block* block, std::size_t size) const;
  Block* alloc_found_block(Request& r, std::size_t requested);
  void free_block(Block* block);
  std::size_t try_merge_blocks(Block* dst, Block* src);
  bool alloc_block(Request& r);
  bool release_available_cached_blocks(const Request& r);
  void release_cached_blocks_locked();
  void release_blocks(BlockPool& pool);
  void release_block(Block* block);
  BlockPool& pool_of(const Block& block) { return block.small ? small_blocks_ : large_blocks_; }
  void note_reserved(std::size_t added);
  [[noreturn]] void throw_out_of_memory(std::size_t bytes) const;

  // Expandable segments (torch_expandable_blocks.cpp).
  Block* find_expandable_block(Request& r);
  bool map_block(Block* to_map, std::size_t size);
  Block* try_allocate_expandable_block(Request& r);
  void unmap_block(Block* block);
  void release_expandable_segment(Block* block);
  void release_expandable_blocks(BlockPool& pool);

  MemoryResource* device_ = nullptr;  // native
  VirtualMemory* vm_ = nullptr;       // expandable
  TorchCachingOptions options_;
  std::size_t device_bytes_ = 0;       // expandable: the most pages mapped at once
  std::size_t range_pages_small_ = 0;  // expandable: pages per range, by pool
  std::size_t range_pages_large_ = 0;

  mutable std::mutex mutex_;
  BlockStore store_;
  BlockPool small_blocks_{true};
  BlockPool large_blocks_{false};
  std::unordered_map<const void*, Block*> active_;
  struct SegmentRecord {
    std::size_t bytes = 0;
    std::uintptr_t stream = 0;
  };
  std::map<const char*, SegmentRecord> segments_;  // native: every segment held, by base
  std::vector<std::unique_ptr<ExpandableSegment>> expandable_;
  std::size_t live_requested_ = 0;
  TorchCachingCounters counters_;
};

}  // namespace sdalloc::replay
