// sdalloc/tensorrt/stream_ordered_allocator.hpp - TensorRT's GPU allocator contract over any
// sdalloc pool, without TensorRT: the logic behind GpuAsyncAllocator (gpu_async_allocator.hpp,
// the thin nvinfer1::IGpuAsyncAllocator forwarder compiled only where TensorRT is found).
//
// The contract (TensorRT's IGpuAsyncAllocator, shared/design.md):
//  - allocate_async(size, alignment, flags, stream): memory usable by work on `stream` in
//    stream order. size 0 -> nullptr. alignment 0 means the pool's minimum (256); otherwise
//    it must be a power of two no larger than the pool's kMaxAlignment, else nullptr (the
//    pool would reject it). `flags` is TensorRT's AllocatorFlags: kRESIZABLE (bit 0) asks
//    for memory reallocate() may grow, which this allocator does not offer (TensorRT then
//    allocates anew); other bits are refused with nullptr, so a future flag is not silently
//    ignored.
//  - deallocate_async(ptr, stream): the memory may be reused once `stream` reaches this
//    point: at once by later work on `stream`, by other streams only after the pool's
//    StreamEvents say that stream's work as of the free has completed (the pool's cross-
//    stream rule: CachingPool, VirtualMemoryPool). Returns false, and frees nothing, for a
//    pointer this allocator did not hand out (or already freed); nullptr -> false.
//  - Errors are nullptr / false, counted and with the last message kept; no exception leaves
//    these two functions (they are noexcept: TensorRT's are).
//  - Thread-safe: the pool is; the counters are atomics and the message has a lock.
// The pool is shared (std::shared_ptr) and lives as long as this object; destroy this after
// the TensorRT runtime and engines that use it (as the pool's own rule: nothing may be freed
// into a destroyed pool).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "sdalloc/core/pool_stats.hpp"
#include "sdalloc/core/stream.hpp"
#include "sdalloc/policies/any_pool.hpp"

namespace sdalloc::tensorrt {

// TensorRT's AllocatorFlag::kRESIZABLE, as the bit of AllocatorFlags it is.
inline constexpr std::uint32_t kResizableFlag = 1U << 0;

struct StreamOrderedAllocatorCounters {
  std::uint64_t allocations = 0;         // non-null answers
  std::uint64_t failed_allocations = 0;  // nullptr answers for a non-zero size
  std::uint64_t deallocations = 0;       // true answers
  std::uint64_t failed_deallocations = 0;
};

class StreamOrderedAllocator {
 public:
  // max_alignment: the largest alignment accepted (the pool's kMaxAlignment).
  StreamOrderedAllocator(std::shared_ptr<AnyPool> pool, std::size_t max_alignment);

  void* allocate_async(std::uint64_t size, std::uint64_t alignment, std::uint32_t flags,
                       Stream stream) noexcept;
  bool deallocate_async(void* memory, Stream stream) noexcept;

  AnyPool& pool() { return *pool_; }
  PoolStats stats() const { return pool_->stats(); }
  StreamOrderedAllocatorCounters counters() const;
  std::string last_error() const;

 private:
  void fail(std::atomic<std::uint64_t>& counter, const char* what) noexcept;

  std::shared_ptr<AnyPool> pool_;
  std::size_t max_alignment_;
  std::atomic<std::uint64_t> allocations_{0};
  std::atomic<std::uint64_t> failed_allocations_{0};
  std::atomic<std::uint64_t> deallocations_{0};
  std::atomic<std::uint64_t> failed_deallocations_{0};
  mutable std::mutex error_mutex_;
  std::string last_error_;
};

}  // namespace sdalloc::tensorrt
