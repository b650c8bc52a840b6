// gpu_async_allocator_check.cpp - sdalloc_tensorrt_tests: the nvinfer1::IGpuAsyncAllocator
// forwarder against real TensorRT and a CUDA device. Built only where TensorRT's headers are
// (tests/tensorrt/CMakeLists.txt); scripts/gpu-check.sh runs it (stage tensorrt). Never
// compiled on the machines this was written on: see docs/tensorrt.md.
#include <NvInferRuntime.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>

#include "sdalloc/cuda/cuda_resource.hpp"
#include "sdalloc/cuda/cuda_stream_events.hpp"
#include "sdalloc/policies/any_pool.hpp"
#include "sdalloc/tensorrt/gpu_async_allocator.hpp"

namespace {

class QuietLogger final : public nvinfer1::ILogger {
  void log(Severity, const char*) noexcept override {}
};

TEST(GpuAsyncAllocator, ServesTensorRTsInterfaceOnADeviceStream) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) GTEST_SKIP() << "no CUDA device";
  sdalloc::CudaResource device(0);
  sdalloc::CudaStreamEvents events(0);
  sdalloc::CachingPoolOptions options;
  options.stream_events = &events;
  auto pool = std::make_shared<sdalloc::PoolOf<sdalloc::CachingPool>>(device, options);
  sdalloc::tensorrt::GpuAsyncAllocator allocator(pool, sdalloc::CachingPool::kMaxAlignment);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);

  nvinfer1::IGpuAsyncAllocator& trt = allocator;
  EXPECT_EQ(trt.allocateAsync(0, 256, 0, stream), nullptr);
  void* p = trt.allocateAsync(std::uint64_t{1} << 20, 512, 0, stream);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 512, 0u);
  EXPECT_EQ(cudaMemsetAsync(p, 0, std::size_t{1} << 20, stream), cudaSuccess);
  EXPECT_TRUE(trt.deallocateAsync(p, stream));
  EXPECT_EQ(trt.allocateAsync(std::uint64_t{1} << 20, 256, 0, stream), p);  // stream order
  EXPECT_TRUE(trt.deallocateAsync(p, stream));
  EXPECT_FALSE(trt.deallocateAsync(&devices, stream));

  QuietLogger logger;
  std::unique_ptr<nvinfer1::IRuntime> runtime(nvinfer1::createInferRuntime(logger));
  ASSERT_NE(runtime, nullptr);
  runtime->setGpuAllocator(&allocator);
  runtime.reset();
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  pool->check_invariants();
}

}  // namespace
