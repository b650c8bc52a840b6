// adjustable_limit_resource.hpp - a capacity cap that can be changed while in use.
//
// LimitResource (sdalloc/resources/limit_resource.hpp) fixes its cap at construction; PyTorch's
// torch.cuda.set_per_process_memory_fraction() may change a device's cap at any time, after
// the pool exists. AdjustableLimitResource keeps the cap in an atomic: a request that would
// take the bytes handed out above the cap throws OutOfMemory (as a full device would), and
// lowering the cap below what is in use only makes later requests fail until enough is
// returned. Cap 0 means no cap. Thread-safe (compare-exchange on the running total).
#pragma once

#include <atomic>
#include <cstddef>
#include <string>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/core/resource.hpp"

namespace sdalloc::torch_shim {

class AdjustableLimitResource final : public MemoryResource {
 public:
  AdjustableLimitResource(MemoryResource& upstream, std::size_t cap)
      : upstream_(upstream), cap_(cap) {}

  void set_cap(std::size_t cap) { cap_.store(cap, std::memory_order_relaxed); }
  std::size_t cap() const { return cap_.load(std::memory_order_relaxed); }
  std::size_t used() const { return used_.load(std::memory_order_relaxed); }

  // The cap when there is one, else the upstream's capacity (a device's memory).
  std::size_t capacity() const override {
    const std::size_t limit = cap();
    return limit != 0 ? limit : upstream_.capacity();
  }
  std::string name() const override {
    const std::size_t limit = cap();
    return limit == 0 ? upstream_.name()
                      : "limit(" + upstream_.name() + ", " + format_size(limit) + ")";
  }

 private:
  void* do_allocate(std::size_t bytes, Stream stream) override {
    if (bytes == 0) return nullptr;
    std::size_t used = used_.load(std::memory_order_relaxed);
    do {
      const std::size_t limit = cap();
      if (limit != 0 && (used > limit || bytes > limit - used)) {
        OutOfMemoryInfo info;
        info.requested = bytes;
        info.capacity = limit;
        throw OutOfMemory::describe(name(), info,
                                    format_bytes(used) +
                                        " of the cap in use (the cap comes "
                                        "from memory_fraction or capacity)");
      }
    } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
    try {
      return upstream_.allocate(bytes, stream);
    } catch (...) {
      used_.fetch_sub(bytes, std::memory_order_relaxed);
      throw;
    }
  }

  void do_deallocate(void* ptr, std::size_t bytes, Stream stream) override {
    if (ptr == nullptr) return;
    upstream_.deallocate(ptr, bytes, stream);
    used_.fetch_sub(bytes, std::memory_order_relaxed);
  }

  MemoryResource& upstream_;
  std::atomic<std::size_t> cap_;
  std::atomic<std::size_t> used_{0};
};

}  // namespace sdalloc::torch_shim
