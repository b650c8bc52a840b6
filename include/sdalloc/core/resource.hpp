// sdalloc/core/resource.hpp - where memory comes from: the MemoryResource interface.
//
// A resource is two functions: allocate(bytes, stream) and deallocate(ptr, bytes, stream).
// Everything in sdalloc is built by nesting resources: allocators such as CachingPool take
// an upstream resource and are resources themselves; adaptors (LimitResource, StatsResource,
// TraceResource) wrap any resource and add one behaviour. A user composes the stack they
// need, e.g. StatsResource(LimitResource(HostResource, 8 GiB)) under a CachingPool.
//
// Contract every implementation keeps:
//  - Thread-safety: allocate and deallocate may be called from any number of threads at once.
//  - Alignment: a non-null result is aligned to at least kMinAlignment (256 bytes, the same
//    guarantee as cudaMalloc), enough for any tensor element type and vector load.
//  - Zero bytes: allocate(0, s) returns nullptr and reserves nothing; deallocate(nullptr, 0,
//    s) does nothing. This matches PyTorch and TensorRT.
//  - Streams: memory from allocate(bytes, s) may be used by work on s at once. The stream
//    given to deallocate is one on which the memory may be reused at once: the caller
//    promises that all work using it is ordered before that point of that stream.
//  - Failure: allocate throws OutOfMemory when the memory is not available and reserves
//    nothing. deallocate of a pointer this resource did not hand out is undefined for raw
//    resources (they cannot always tell); pools check and throw InvalidPointer.
//  - bytes passed to deallocate are the bytes passed to allocate.
//
// Beside them, two questions: capacity() (the most it can hand out, for limits and error
// messages) and name(). A resource says nothing about how its memory is mapped: a pool that
// moves or maps pages does so through VirtualMemory (virtual_memory.hpp), not through a
// resource, so an adaptor wrapped around a resource can never change what a pool above it
// decides.
#pragma once

#include <cstddef>
#include <string>

#include "sdalloc/core/stream.hpp"

namespace sdalloc {

inline constexpr std::size_t kMinAlignment = 256;

class MemoryResource {
 public:
  MemoryResource() = default;
  MemoryResource(const MemoryResource&) = delete;
  MemoryResource& operator=(const MemoryResource&) = delete;
  virtual ~MemoryResource() = default;

  void* allocate(std::size_t bytes, Stream stream = kDefaultStream) {
    return do_allocate(bytes, stream);
  }
  void deallocate(void* ptr, std::size_t bytes, Stream stream = kDefaultStream) {
    do_deallocate(ptr, bytes, stream);
  }

  // Most bytes this resource can ever hand out at once, or 0 when it has no fixed limit.
  // LimitResource reports its cap; a device resource its device memory.
  virtual std::size_t capacity() const { return 0; }
  // Short name for tables and error messages, e.g. "host", "limit(host, 8.0 GiB)".
  virtual std::string name() const = 0;

 private:
  virtual void* do_allocate(std::size_t bytes, Stream stream) = 0;
  virtual void do_deallocate(void* ptr, std::size_t bytes, Stream stream) = 0;
};

}  // namespace sdalloc
