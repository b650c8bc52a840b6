// sdalloc/resources/limit_resource.hpp - a capacity cap that fails like a full device.
//
// LimitResource forwards to an upstream resource while the bytes it has handed out stay
// within `capacity`; a request that would pass the cap throws OutOfMemory exactly as a GPU
// with that much memory would, without touching the upstream. This is how to ask "does this
// workload fit on an 8 GiB card?" on any machine:
//     HostResource host;
//     LimitResource card(host, 8ull << 30);
//     CachingPool pool(card);
// Thread-safe: the running total is a CapacityCap (capacity_cap.hpp), checked and updated
// with one compare-exchange.
// The upstream must outlive the adaptor.
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include "sdalloc/core/resource.hpp"
#include "sdalloc/resources/capacity_cap.hpp"

namespace sdalloc {

class LimitResource final : public MemoryResource {
 public:
  LimitResource(MemoryResource& upstream, std::size_t capacity);

  std::size_t capacity() const override { return cap_.limit(); }
  std::string name() const override;
  bool can_coalesce() const override { return upstream_.can_coalesce(); }
  bool can_grow() const override { return upstream_.can_grow(); }
  std::size_t page_size() const override { return upstream_.page_size(); }

  std::size_t used() const { return cap_.used(); }
  std::size_t available() const { return capacity() - used(); }
  MemoryResource& upstream() const { return upstream_; }

 private:
  void* do_allocate(std::size_t bytes, Stream stream) override;
  void do_deallocate(void* ptr, std::size_t bytes, Stream stream) override;
  void* do_coalesce(std::span<const ResourceRange> ranges, std::size_t bytes,
                    Stream stream) override;
  bool do_split(void* ptr, std::size_t bytes, std::size_t first) override;
  bool do_grow(void* ptr, std::size_t bytes, std::size_t new_bytes,
               std::span<const ResourceRange> donors, Stream stream) override;

  MemoryResource& upstream_;
  CapacityCap cap_;  // its limit never changes
};

}  // namespace sdalloc
