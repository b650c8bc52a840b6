// sdalloc/core/pool.hpp - what every pool is: the Pool concept, its contract written once.
//
// A resource (resource.hpp) hands out segments. A pool carves tensors out of the memory it
// takes from below and keeps what is freed for the next request. CachingPool (cached
// segments), VirtualMemoryPool (pages mapped into reserved ranges) and PlannedArena (a
// recorded step served by position) are pools; the C API, the PyTorch shim, `sdalloc replay`
// and the conformance suite use any of them through this concept, or through AnyPool
// (policies/any_pool.hpp) where the kind of pool is chosen at run time.
//
// Contract every pool keeps, on top of MemoryResource's (a pool is a resource too: its
// allocate(bytes, stream) / deallocate(ptr, bytes, stream) follow resource.hpp):
//  - allocate(bytes, alignment, stream): alignment is a power of two <= kMaxAlignment;
//    values up to kRounding cost nothing. Sizes round up to kRounding. allocate(0, ...)
//    returns nullptr and counts nothing. Above kMaxAllocation: OutOfMemory.
//  - free(ptr, stream): a free that does not state the size (C API, PyTorch); free(nullptr)
//    does nothing. `stream` is where the memory may be reused at once.
//  - record_stream(ptr, stream): work on `stream` also uses the allocation (PyTorch's
//    Tensor.record_stream); the block is not reused before that stream's work is done.
//  - allocation_size(ptr): the bytes requested for a live allocation.
//  - trim(): gives back to the layer below what the pool holds and nobody uses; answers how
//    many bytes. Waits for pending cross-stream frees first.
//  - stats() / reset_peak(): the figures of pool_stats.hpp; reset_peak sets every peak to
//    its current value.
//  - check_invariants(): walks the pool's records and throws Error naming the first broken
//    invariant. For tests and debugging; it takes the pool's locks in turn.
//  - Streams: a block freed on stream S is reused at once on S; on another stream only once
//    the event recorded on S has completed (stream_events.hpp).
//  - Thread-safety: every member may be called from any number of threads at once.
//  - Errors leave the pool unchanged and usable: OutOfMemory (states the request, live and
//    reserved bytes, the largest free block and the capacity), InvalidArgument (bad
//    alignment, a deallocate whose size differs from the allocation's, bad options),
//    InvalidPointer (a pointer that is not a live allocation of this pool: never handed out,
//    freed already, or inside a block).
#pragma once

#include <concepts>
#include <cstddef>

#include "sdalloc/core/pool_stats.hpp"
#include "sdalloc/core/resource.hpp"
#include "sdalloc/core/stream.hpp"

namespace sdalloc {

// The limits every pool shares (kRounding, kMaxAlignment, kMaxAllocation of each pool).
inline constexpr std::size_t kPoolRounding = 512;
inline constexpr std::size_t kPoolMaxAlignment = std::size_t{1} << 30;
inline constexpr std::size_t kPoolMaxAllocation = std::size_t{1} << 48;

// A pool derives from PoolLimits to state them as its own (CachingPool::kRounding, ...).
struct PoolLimits {
  static constexpr std::size_t kRounding = kPoolRounding;
  static constexpr std::size_t kMaxAlignment = kPoolMaxAlignment;
  static constexpr std::size_t kMaxAllocation = kPoolMaxAllocation;
};

template <typename P>
concept Pool = std::derived_from<P, MemoryResource> &&
    requires(P& pool, const P& const_pool, void* ptr, const void* const_ptr, std::size_t bytes,
             Stream stream) {
  { P::kRounding } -> std::convertible_to<std::size_t>;
  { P::kMaxAlignment } -> std::convertible_to<std::size_t>;
  { P::kMaxAllocation } -> std::convertible_to<std::size_t>;
  { pool.allocate(bytes, bytes, stream) } -> std::same_as<void*>;
  { pool.free(ptr, stream) } -> std::same_as<void>;
  { pool.record_stream(ptr, stream) } -> std::same_as<void>;
  { const_pool.allocation_size(const_ptr) } -> std::same_as<std::size_t>;
  { pool.trim() } -> std::same_as<std::size_t>;
  { const_pool.stats() } -> std::same_as<PoolStats>;
  { pool.reset_peak() } -> std::same_as<void>;
  { const_pool.check_invariants() } -> std::same_as<void>;
};

}  // namespace sdalloc
