// sdalloc/cuda/cuda_resource.hpp - device memory straight from cudaMalloc.
//
// CudaResource hands out device memory of one device with cudaMalloc and returns it with
// cudaFree. It is the plain upstream for a CachingPool: every call is a (slow, device-wide
// synchronizing) CUDA call, so nothing should use it for individual tensors.
//
// Streams: cudaMalloc memory is usable on every stream at once, and cudaFree waits for all
// work on the device before it frees, so both stream arguments are ignored.
// Device: each call makes `device` current for its duration and restores the calling
// thread's current device afterwards.
// Alignment: 256 bytes (cudaMalloc's guarantee, kMinAlignment).
// Thread-safe: no state besides the device number; the CUDA runtime is thread-safe.
//
// Errors:
//  - constructor: CudaError when there is no usable driver or device (cudaGetDeviceCount's
//    error named), InvalidArgument when `device` is not in [0, device_count()).
//  - allocate: OutOfMemory when cudaMalloc reports cudaErrorMemoryAllocation (the error is
//    cleared, so it does not linger for cudaGetLastError); CudaError for any other failure.
//  - deallocate: CudaError when cudaFree fails (a foreign pointer is undefined, as for
//    every raw resource); a free after the runtime has shut down is ignored.
#pragma once

#include <cstddef>
#include <string>

#include "sdalloc/core/resource.hpp"

namespace sdalloc::cuda {

class CudaResource final : public MemoryResource {
 public:
  explicit CudaResource(int device = 0);

  int device() const { return device_; }
  // The device's total memory (cudaDeviceProp::totalGlobalMem).
  std::size_t capacity() const override { return capacity_; }
  std::string name() const override;  // "cuda(<device>)"

 private:
  void* do_allocate(std::size_t bytes, Stream stream) override;
  void do_deallocate(void* ptr, std::size_t bytes, Stream stream) override;

  int device_;
  std::string name_;  // made once: every call's errors name the resource
  std::size_t capacity_ = 0;
};

}  // namespace sdalloc::cuda
