// cuda_stream_device_test.cpp - the unit offloader's CUDA device: without a device its
// constructor refuses; with one, an offload whose "kernels" are device->host copies on the
// compute stream reads every unit's bytes in stream order, and hold() keeps a stream
// waiting until open(). (Run by gpu-check's cuda-tests stage; skipped without a device.)
#include "sdalloc/cuda/cuda_stream_device.hpp"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "cuda_device_check.hpp"
#include "sdalloc/cuda/cuda_error.hpp"
#include "sdalloc/transfer/unit_offloader.hpp"

namespace sdalloc::cuda {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

TEST(CudaStreamDevice, WithoutADeviceItRefusesToBeMade) {
  SDALLOC_REQUIRE_NO_CUDA_DEVICE();
  EXPECT_THROW(CudaStreamDevice(CudaStreamDeviceOptions{}), CudaError);
}

TEST(CudaStreamDevice, AnOffloadReadsEveryUnitInStreamOrder) {
  SDALLOC_REQUIRE_CUDA_DEVICE();
  cudaStream_t compute = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), cudaSuccess);
  {
    CudaStreamDevice device(CudaStreamDeviceOptions{0, compute});
    UnitOffloadOptions options;
    options.budget = 24 * kMiB;
    UnitOffloader offloader(device, options);
    constexpr std::size_t kUnits = 12;
    for (std::size_t u = 0; u < kUnits; ++u) offloader.add_unit((4 + u % 3) * kMiB);
    offloader.seal();
    for (std::size_t u = 0; u < kUnits; ++u) {
      std::memset(offloader.host_image(u), static_cast<int>(u + 1), (4 + u % 3) * kMiB);
    }
    // The "kernels": each unit's first and last KiB copied back on the compute stream.
    auto* readback = static_cast<unsigned char*>(device.allocate_pinned(kUnits * 2048));
    for (int step = 0; step < 5; ++step) {
      std::memset(readback, 0, kUnits * 2048);
      offloader.begin_step(device.compute_stream());
      for (std::size_t u = 0; u < kUnits; ++u) {
        offloader.enter(u);
        const auto* image = static_cast<const unsigned char*>(offloader.device_image(u));
        const std::size_t bytes = (4 + u % 3) * kMiB;
        ASSERT_EQ(
            cudaMemcpyAsync(readback + u * 2048, image, 1024, cudaMemcpyDeviceToHost, compute),
            cudaSuccess);
        ASSERT_EQ(cudaMemcpyAsync(readback + u * 2048 + 1024, image + bytes - 1024, 1024,
                                  cudaMemcpyDeviceToHost, compute),
                  cudaSuccess);
      }
      offloader.end_step();
      ASSERT_EQ(cudaStreamSynchronize(compute), cudaSuccess);
      for (std::size_t u = 0; u < kUnits; ++u) {
        for (std::size_t i = 0; i < 2048; ++i) {
          ASSERT_EQ(readback[u * 2048 + i], u + 1) << "step " << step << " unit " << u;
        }
      }
    }
    const UnitOffloadStats stats = offloader.stats();
    EXPECT_EQ(stats.planned_steps, 4u);
    EXPECT_GT(stats.streamed_units, 0u);
    EXPECT_LE(stats.region_bytes, options.budget);
    EXPECT_EQ(stats.device_allocations, 1u);
    EXPECT_FALSE(stats.registration_refused) << offloader.registration_refusal();
    device.free_pinned(readback, kUnits * 2048);
  }
  ASSERT_EQ(cudaStreamDestroy(compute), cudaSuccess);
}

TEST(CudaStreamDevice, AHeldStreamWaitsForOpen) {
  SDALLOC_REQUIRE_CUDA_DEVICE();
  CudaStreamDevice device(CudaStreamDeviceOptions{});
  const StreamDevice::Event before = device.create_event(true);
  const StreamDevice::Event after = device.create_event(true);
  device.record(before, DeviceQueue::kCopy);
  const StreamDevice::Hold hold = device.hold(DeviceQueue::kCopy);
  device.record(after, DeviceQueue::kCopy);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  device.open(hold);
  device.wait_host(after);
  EXPECT_GE(device.elapsed_seconds(before, after), 0.04);  // the stream waited for open()
  EXPECT_LT(device.elapsed_seconds(before, after), StreamDevice::kHoldTimeoutSeconds);
}

}  // namespace
}  // namespace sdalloc::cuda
