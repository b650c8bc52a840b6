// sdalloc/tensorrt/gpu_async_allocator.hpp - sdalloc as TensorRT's nvinfer1::IGpuAsyncAllocator
// (IRuntime::setGpuAllocator, IBuilder::setGpuAllocator).
//
// A thin forwarder: every call goes to StreamOrderedAllocator (stream_ordered_allocator.hpp),
// which holds the contract and is tested without TensorRT. Header-only; include it only
// where TensorRT's headers are (NvInferRuntime.h, TensorRT 10). UNTESTED against TensorRT:
// no machine this project has run on had TensorRT; scripts/gpu-check.sh runs its check
// (stage tensorrt) where TensorRT is found and says it skipped it where not.
//
// Usage: auto pool = std::make_shared<sdalloc::PoolOf<sdalloc::CachingPool>>(device_resource,
//            options_with_cuda_stream_events);
//        sdalloc::tensorrt::GpuAsyncAllocator allocator(pool, sdalloc::CachingPool::kMaxAlignment);
//        runtime->setGpuAllocator(&allocator);   // allocator outlives the runtime and engines
#pragma once

#include <NvInferRuntime.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <utility>

#include "sdalloc/core/stream.hpp"
#include "sdalloc/tensorrt/stream_ordered_allocator.hpp"

namespace sdalloc::tensorrt {

class GpuAsyncAllocator final : public nvinfer1::IGpuAsyncAllocator {
 public:
  GpuAsyncAllocator(std::shared_ptr<AnyPool> pool, std::size_t max_alignment)
      : core_(std::move(pool), max_alignment) {}

  void* allocateAsync(std::uint64_t const size, std::uint64_t const alignment,
                      nvinfer1::AllocatorFlags const flags, cudaStream_t stream) noexcept override {
    return core_.allocate_async(size, alignment, static_cast<std::uint32_t>(flags),
                                Stream::from_native(stream));
  }
  bool deallocateAsync(void* const memory, cudaStream_t stream) noexcept override {
    return core_.deallocate_async(memory, Stream::from_native(stream));
  }

  StreamOrderedAllocator& core() { return core_; }

 private:
  StreamOrderedAllocator core_;
};

}  // namespace sdalloc::tensorrt
