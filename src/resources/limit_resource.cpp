// limit_resource.cpp - a capacity cap enforced before the upstream is asked.
//
// The reservation is taken first (compare-exchange on used_), then the upstream is called,
// so concurrent requests can never pass the cap together; if the upstream throws, the
// reservation is given back and the resource is as before.
#include "sdalloc/resources/limit_resource.hpp"

#include "sdalloc/core/errors.hpp"

namespace sdalloc {

LimitResource::LimitResource(MemoryResource& upstream, std::size_t capacity)
    : upstream_(upstream), capacity_(capacity) {}

std::string LimitResource::name() const {
  return "limit(" + upstream_.name() + ", " + format_size(capacity_) + ")";
}

void* LimitResource::do_allocate(std::size_t bytes, Stream stream) {
  if (bytes == 0) return nullptr;
  std::size_t used = used_.load(std::memory_order_relaxed);
  do {
    if (bytes > capacity_ - used) {
      OutOfMemoryInfo info;
      info.requested = bytes;
      info.capacity = capacity_;
      throw OutOfMemory::describe(name(), info,
                                  format_bytes(used) + " of the capacity in use, " +
                                      format_bytes(capacity_ - used) + " available");
    }
  } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));

  try {
    return upstream_.allocate(bytes, stream);
  } catch (...) {
    used_.fetch_sub(bytes, std::memory_order_relaxed);
    throw;
  }
}

void LimitResource::do_deallocate(void* ptr, std::size_t bytes, Stream stream) {
  if (ptr == nullptr) return;
  upstream_.deallocate(ptr, bytes, stream);
  used_.fetch_sub(bytes, std::memory_order_relaxed);
}

}  // namespace sdalloc
