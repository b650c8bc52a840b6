// stream_ordered_allocator.cpp - StreamOrderedAllocator: TensorRT's allocator contract over an
// AnyPool, every error answered as nullptr / false (sdalloc/tensorrt/stream_ordered_allocator.hpp).
#include "sdalloc/tensorrt/stream_ordered_allocator.hpp"

#include <exception>
#include <string>
#include <utility>

#include "core/bits.hpp"
#include "sdalloc/core/errors.hpp"

namespace sdalloc::tensorrt {

namespace {

constexpr std::size_t kDefaultAlignment = 256;  // sdalloc's minimum (core/resource.hpp)

}  // namespace

StreamOrderedAllocator::StreamOrderedAllocator(std::shared_ptr<AnyPool> pool,
                                               std::size_t max_alignment)
    : pool_(std::move(pool)), max_alignment_(max_alignment) {
  if (!pool_) throw InvalidArgument("StreamOrderedAllocator needs a pool");
  if (!is_power_of_two(max_alignment_)) {
    throw InvalidArgument("StreamOrderedAllocator: max_alignment must be a power of two");
  }
}

void StreamOrderedAllocator::fail(std::atomic<std::uint64_t>& counter, const char* what) noexcept {
  counter.fetch_add(1, std::memory_order_relaxed);
  try {
    const std::lock_guard lock(error_mutex_);
    last_error_ = what;
  } catch (...) {  // NOLINT(bugprone-empty-catch): a message we cannot keep is dropped
  }
}

void* StreamOrderedAllocator::allocate_async(std::uint64_t size, std::uint64_t alignment,
                                             std::uint32_t flags, Stream stream) noexcept {
  if (size == 0) return nullptr;
  if ((flags & ~kResizableFlag) != 0) {
    fail(failed_allocations_, "allocate_async: unknown AllocatorFlags bits");
    return nullptr;
  }
  if (alignment == 0) alignment = kDefaultAlignment;
  if (!is_power_of_two(alignment) || alignment > max_alignment_) {
    fail(failed_allocations_,
         "allocate_async: the alignment must be a power of two no larger than the pool's");
    return nullptr;
  }
  if (alignment < kDefaultAlignment) alignment = kDefaultAlignment;  // stricter is fine
  try {
    void* p = pool_->allocate(static_cast<std::size_t>(size), static_cast<std::size_t>(alignment),
                              stream);
    if (p == nullptr) {
      fail(failed_allocations_, "allocate_async: the pool returned no memory");
      return nullptr;
    }
    allocations_.fetch_add(1, std::memory_order_relaxed);
    return p;
  } catch (const std::exception& e) {
    fail(failed_allocations_, e.what());
  } catch (...) {
    fail(failed_allocations_, "allocate_async: unknown error");
  }
  return nullptr;
}

bool StreamOrderedAllocator::deallocate_async(void* memory, Stream stream) noexcept {
  if (memory == nullptr) {
    fail(failed_deallocations_, "deallocate_async: nullptr");
    return false;
  }
  try {
    pool_->free(memory, stream);
    deallocations_.fetch_add(1, std::memory_order_relaxed);
    return true;
  } catch (const std::exception& e) {
    fail(failed_deallocations_, e.what());
  } catch (...) {
    fail(failed_deallocations_, "deallocate_async: unknown error");
  }
  return false;
}

StreamOrderedAllocatorCounters StreamOrderedAllocator::counters() const {
  return {allocations_.load(), failed_allocations_.load(), deallocations_.load(),
          failed_deallocations_.load()};
}

std::string StreamOrderedAllocator::last_error() const {
  const std::lock_guard lock(error_mutex_);
  return last_error_;
}

}  // namespace sdalloc::tensorrt
