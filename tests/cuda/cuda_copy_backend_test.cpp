// cuda_copy_backend_test.cpp - the TransferEngine on a CUDA device: packed, chunked and
// pinned copies land, a packed batch is one call, stream_wait orders a compute stream,
// mapped memory is shared, weight offload serves equal bytes (also stream-ordered, on the
// stack the PyTorch shim's CUDA offload uses); without a device the backend refuses to
// start with CudaError.
#include "sdalloc/cuda/cuda_copy_backend.hpp"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "cuda_device_check.hpp"
#include "sdalloc/cuda/cuda_error.hpp"
#include "sdalloc/cuda/cuda_resource.hpp"
#include "sdalloc/cuda/cuda_stream_events.hpp"
#include "sdalloc/policies/caching_pool.hpp"
#include "sdalloc/resources/limit_resource.hpp"
#include "sdalloc/transfer/transfer_engine.hpp"
#include "sdalloc/transfer/weight_offloader.hpp"

namespace sdalloc::cuda {
namespace {

constexpr std::size_t kKiB = 1024;
constexpr std::size_t kMiB = kKiB * kKiB;

TEST(CudaCopyBackendWithoutDevice, ConstructorThrowsCudaError) {
  SDALLOC_REQUIRE_NO_CUDA_DEVICE();
  EXPECT_THROW(CudaCopyBackend{}, CudaError);
}

TEST(CudaCopyBackend, EveryPathRoundTripsThroughTheDevice) {
  SDALLOC_REQUIRE_CUDA_DEVICE();
  CudaCopyBackend backend;
  TransferEngineOptions options;
  options.chunk_bytes = kMiB;
  TransferEngine engine(backend, options);
  CudaResource device;
  const std::vector<std::size_t> sizes = {4 * kKiB, 100, 3 * kMiB + 5};
  for (const std::size_t bytes : sizes) {
    std::vector<unsigned char> host(bytes), back(bytes, 0);
    for (std::size_t i = 0; i < bytes; ++i) host[i] = static_cast<unsigned char>(i * 7 + bytes);
    void* d = device.allocate(bytes);
    engine.copy(CopyKind::kHostToDevice, d, host.data(), bytes).wait();
    engine.copy(CopyKind::kDeviceToHost, back.data(), d, bytes).wait();
    EXPECT_EQ(back, host) << bytes << " bytes";
    device.deallocate(d, bytes);
  }
  // 1000 small tensors: packed, one batched call.
  const std::size_t before = backend.calls();
  std::vector<unsigned char> host(1000 * 4 * kKiB, 3), back(host.size(), 0);
  void* d = device.allocate(host.size());
  for (std::size_t i = 0; i < 1000; ++i) {
    (void)engine.copy(CopyKind::kHostToDevice, static_cast<char*>(d) + i * 4 * kKiB,
                      host.data() + i * 4 * kKiB, 4 * kKiB);
  }
  engine.synchronize();
  EXPECT_LE(backend.calls() - before, 2u);
  // Pinned in place: direct.
  engine.register_host(back.data(), back.size());
  const TransferHandle h = engine.copy(CopyKind::kDeviceToHost, back.data(), d, back.size());
  cudaStream_t compute = nullptr;
  ASSERT_EQ(cudaStreamCreate(&compute), cudaSuccess);
  engine.stream_wait(h, Stream::from_native(compute));
  ASSERT_EQ(cudaStreamSynchronize(compute), cudaSuccess);
  h.wait();
  EXPECT_EQ(back, host);
  engine.unregister_host(back.data());
  (void)cudaStreamDestroy(compute);
  device.deallocate(d, host.size());
  const MappedBuffer mapped = engine.map(4096);
  EXPECT_NE(mapped.device, nullptr);
  engine.unmap(mapped);
}

TEST(CudaCopyBackend, OffloadedWeightsArriveIntact) {
  SDALLOC_REQUIRE_CUDA_DEVICE();
  CudaCopyBackend backend;
  TransferEngine engine(backend);
  CudaResource device;
  std::vector<std::vector<unsigned char>> weights;
  for (int i = 0; i < 6; ++i) weights.emplace_back(kMiB, static_cast<unsigned char>(i + 1));
  WeightOffloader offloader(engine, device, OffloadOptions{3 * kMiB, 2, true});
  for (const auto& w : weights) offloader.add_weight(w.data(), w.size());
  std::vector<unsigned char> back(kMiB);
  for (int step = 0; step < 3; ++step) {
    offloader.begin_step();
    for (std::size_t l = 0; l < weights.size(); ++l) {
      void* p = offloader.acquire(std::span<const std::size_t>(&l, 1))[0];
      ASSERT_EQ(cudaMemcpy(back.data(), p, kMiB, cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_EQ(back, weights[l]);
    }
    offloader.end_step();
  }
  EXPECT_LE(offloader.stats().peak_resident_bytes, 3 * kMiB);
}

// The shim's sdalloc_torch_offload_create_cuda stack: a CachingPool over a capped
// cudaMalloc with CUDA events, stream_ordered on a compute stream. The "layer" reads each
// weight on the compute stream (a device->host copy queued there, never waited for by the
// host until the step ends), so a load that overwrote memory still being read, or a read
// before its load, would show as wrong bytes.
TEST(CudaCopyBackend, StreamOrderedOffloadReadsEqualBytesOnTheComputeStream) {
  SDALLOC_REQUIRE_CUDA_DEVICE();
  CudaCopyBackend backend;
  TransferEngine engine(backend);
  CudaResource memory;
  constexpr std::size_t kBudget = 3 * kMiB;
  LimitResource limit(memory, kBudget + 64 * kMiB);
  CudaStreamEvents events;
  CachingPoolOptions pool_options;
  pool_options.stream_events = &events;
  CachingPool pool(limit, pool_options);
  cudaStream_t compute = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), cudaSuccess);
  std::vector<std::vector<unsigned char>> weights;
  for (int i = 0; i < 8; ++i) weights.emplace_back(kMiB, static_cast<unsigned char>(i + 1));
  std::vector<unsigned char> read_back(weights.size() * kMiB);
  ASSERT_EQ(cudaHostRegister(read_back.data(), read_back.size(), cudaHostRegisterDefault),
            cudaSuccess);
  {
    OffloadOptions options{kBudget, 2, true};
    options.stream_ordered = true;
    options.compute_stream = Stream::from_native(compute);
    WeightOffloader offloader(engine, pool, options);
    for (const auto& w : weights) offloader.add_weight(w.data(), w.size());
    for (int step = 0; step < 3; ++step) {
      offloader.begin_step();
      for (std::size_t l = 0; l < weights.size(); ++l) {
        void* p = offloader.acquire(std::span<const std::size_t>(&l, 1))[0];
        ASSERT_EQ(
            cudaMemcpyAsync(read_back.data() + l * kMiB, p, kMiB, cudaMemcpyDeviceToHost, compute),
            cudaSuccess);
      }
      offloader.end_step();
      ASSERT_EQ(cudaStreamSynchronize(compute), cudaSuccess);
      for (std::size_t l = 0; l < weights.size(); ++l) {
        EXPECT_TRUE(std::equal(weights[l].begin(), weights[l].end(),
                               read_back.begin() + static_cast<std::ptrdiff_t>(l * kMiB)))
            << "step " << step << " layer " << l;
      }
    }
    const OffloadStats stats = offloader.stats();
    EXPECT_LE(stats.peak_resident_bytes, kBudget);
    EXPECT_EQ(stats.planned_steps, 2U);
    EXPECT_LE(pool.stats().peak_reserved_bytes, kBudget + 64 * kMiB);
  }
  EXPECT_EQ(cudaHostUnregister(read_back.data()), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(compute), cudaSuccess);
}

}  // namespace
}  // namespace sdalloc::cuda
