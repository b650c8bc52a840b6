// adjustable_limit_resource.hpp - a capacity cap that can be changed while in use.
//
// LimitResource (sdalloc/resources/limit_resource.hpp) fixes its cap at construction; PyTorch's
// torch.cuda.set_per_process_memory_fraction() may change a device's cap at any time, after
// the pool exists. AdjustableLimitResource keeps the cap in a CapacityCap
// (sdalloc/resources/capacity_cap.hpp, the loop LimitResource uses too): a request that would
// take the bytes handed out above the cap throws OutOfMemory (as a full device would), and
// lowering the cap below what is in use only makes later requests fail until enough is
// returned. Cap 0 means no cap (CapacityCap::kNoLimit inside). Thread-safe (compare-exchange on
// the running total).
#pragma once

#include <cstddef>
#include <string>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/core/resource.hpp"
#include "sdalloc/resources/capacity_cap.hpp"

namespace sdalloc::torch_shim {

class AdjustableLimitResource final : public MemoryResource {
 public:
  AdjustableLimitResource(MemoryResource& upstream, std::size_t cap)
      : upstream_(upstream), cap_(to_limit(cap)) {}

  void set_cap(std::size_t cap) { cap_.set_limit(to_limit(cap)); }
  std::size_t cap() const {
    const std::size_t limit = cap_.limit();
    return limit == CapacityCap::kNoLimit ? 0 : limit;
  }
  std::size_t used() const { return cap_.used(); }

  // The cap when there is one, else the upstream's capacity (a device's memory).
  std::size_t capacity() const override {
    const std::size_t limit = cap();
    return limit != 0 ? limit : upstream_.capacity();
  }
  std::size_t page_size() const override { return upstream_.page_size(); }
  std::string name() const override {
    const std::size_t limit = cap();
    return limit == 0 ? upstream_.name()
                      : "limit(" + upstream_.name() + ", " + format_size(limit) + ")";
  }

 private:
  void* do_allocate(std::size_t bytes, Stream stream) override {
    if (bytes == 0) return nullptr;
    const CapacityCap::Reservation reservation = cap_.try_reserve(bytes);
    if (!reservation) {
      OutOfMemoryInfo info;
      info.requested = bytes;
      info.capacity = reservation.limit;
      throw OutOfMemory::describe(name(), info,
                                  format_bytes(reservation.used) +
                                      " of the cap in use (the cap comes "
                                      "from memory_fraction or capacity)");
    }
    try {
      return upstream_.allocate(bytes, stream);
    } catch (...) {
      cap_.release(bytes);
      throw;
    }
  }

  void do_deallocate(void* ptr, std::size_t bytes, Stream stream) override {
    if (ptr == nullptr) return;
    upstream_.deallocate(ptr, bytes, stream);
    cap_.release(bytes);
  }

  // Cap 0 (no cap) is the CapacityCap without a limit.
  static std::size_t to_limit(std::size_t cap) { return cap == 0 ? CapacityCap::kNoLimit : cap; }

  MemoryResource& upstream_;
  CapacityCap cap_;
};

}  // namespace sdalloc::torch_shim
