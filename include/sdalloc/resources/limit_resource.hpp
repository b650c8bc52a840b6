// sdalloc/resources/limit_resource.hpp - a capacity cap that fails like a full device.
//
// LimitResource forwards to an upstream resource while the bytes it has handed out stay
// within `capacity`; a request that would pass the cap throws OutOfMemory exactly as a GPU
// with that much memory would, without touching the upstream. This is how to ask "does this
// workload fit on an 8 GiB card?" on any machine:
//     HostResource host;
//     LimitResource card(host, 8ull << 30);
//     CachingPool pool(card);
// The cap may change while the resource is in use (set_capacity: PyTorch's
// set_per_process_memory_fraction does so after the pool exists); lowering it below what is
// in use takes nothing back, later requests fail until enough is returned. kNoLimit means no
// cap: the adaptor then only counts, and reports the upstream's capacity and name.
// Thread-safe: the running total is a CapacityCap (capacity_cap.hpp), checked and updated
// with one compare-exchange.
// The upstream must outlive the adaptor.
#pragma once

#include <cstddef>
#include <string>

#include "sdalloc/core/resource.hpp"
#include "sdalloc/resources/capacity_cap.hpp"

namespace sdalloc {

class LimitResource final : public MemoryResource {
 public:
  static constexpr std::size_t kNoLimit = CapacityCap::kNoLimit;

  LimitResource(MemoryResource& upstream, std::size_t capacity);

  // The cap, or the upstream's capacity where there is none (kNoLimit).
  std::size_t capacity() const override {
    const std::size_t limit = cap_.limit();
    return limit == kNoLimit ? upstream_.capacity() : limit;
  }
  void set_capacity(std::size_t capacity) { cap_.set_limit(capacity); }
  std::string name() const override;

  std::size_t used() const { return cap_.used(); }
  // Bytes the cap still grants: 0 once a lowered cap is below what is in use, and
  // kNoLimit where neither this adaptor nor the upstream has a cap.
  std::size_t available() const {
    const std::size_t total = capacity(), in_use = used();
    if (total == 0) return kNoLimit;
    return total > in_use ? total - in_use : 0;
  }
  MemoryResource& upstream() const { return upstream_; }

 private:
  void* do_allocate(std::size_t bytes, Stream stream) override;
  void do_deallocate(void* ptr, std::size_t bytes, Stream stream) override;

  MemoryResource& upstream_;
  CapacityCap cap_;
};

}  // namespace sdalloc
