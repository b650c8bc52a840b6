// plain_resource.hpp - host memory behind a resource that offers only the two functions: it
// neither coalesces, splits nor grows (MemoryResource's defaults), as CUDA's resources. The
// tests of those optional operations check that a pool over it does without them.
#pragma once

#include <cstddef>
#include <string>

#include "sdalloc/core/resource.hpp"
#include "sdalloc/resources/host_resource.hpp"

namespace sdalloc::test {

class PlainResource final : public MemoryResource {
 public:
  std::string name() const override { return "plain"; }

 private:
  void* do_allocate(std::size_t bytes, Stream stream) override {
    return host_.allocate(bytes, stream);
  }
  void do_deallocate(void* ptr, std::size_t bytes, Stream stream) override {
    host_.deallocate(ptr, bytes, stream);
  }
  HostResource host_;
};

}  // namespace sdalloc::test
