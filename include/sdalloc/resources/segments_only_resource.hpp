// sdalloc/resources/segments_only_resource.hpp - memory seen as a GPU's: whole segments only.
//
// SegmentsOnlyResource forwards allocate and deallocate to an upstream resource and offers
// nothing else: no coalesce, grow or split in place, no page size (MemoryResource's
// defaults), as cudaMalloc's memory offers none. A pool over it behaves as it does on a
// device - it consolidates by releasing segments and taking a new one, and rounds huge
// segments to its granularity - while the memory is the host's:
//     HostResource host;
//     SegmentsOnlyResource device_like(host);
//     CachingPool pool(device_like);   // as over CudaResource, without a GPU
// `sdalloc replay --device-like` replays traces so. Thread-safe as its upstream is; the
// upstream must outlive the adaptor.
#pragma once

#include <cstddef>
#include <string>

#include "sdalloc/core/resource.hpp"

namespace sdalloc {

class SegmentsOnlyResource final : public MemoryResource {
 public:
  explicit SegmentsOnlyResource(MemoryResource& upstream) : upstream_(upstream) {}

  std::size_t capacity() const override { return upstream_.capacity(); }
  std::string name() const override { return "segments-only(" + upstream_.name() + ")"; }

 private:
  void* do_allocate(std::size_t bytes, Stream stream) override {
    return upstream_.allocate(bytes, stream);
  }
  void do_deallocate(void* ptr, std::size_t bytes, Stream stream) override {
    upstream_.deallocate(ptr, bytes, stream);
  }

  MemoryResource& upstream_;
};

}  // namespace sdalloc
