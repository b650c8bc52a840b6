// Conformance of the CUDA resources on a real device (skipped, with the reason, where there
// is none): alignment, zero bytes, memory that holds what is written (checked by copies
// through the device), disjoint allocations, several threads at once, stream-ordered
// allocation and the release threshold of CudaAsyncResource, out-of-memory errors that
// leave the resource usable, and pinning existing host memory.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "cuda_device_check.hpp"
#include "sdalloc/config/make_pool.hpp"
#include "sdalloc/core/errors.hpp"
#include "sdalloc/cuda/cuda_async_resource.hpp"
#include "sdalloc/cuda/cuda_error.hpp"
#include "sdalloc/cuda/cuda_resource.hpp"
#include "sdalloc/cuda/device_resource.hpp"
#include "sdalloc/cuda/pinned_host_resource.hpp"
#include "stream_gate.hpp"
#include "support/test_support.hpp"

namespace sdalloc::cuda {
namespace {

using sdalloc::test::Contains;
constexpr std::size_t kMiB = std::size_t{1} << 20;

// Copies [ptr, ptr + bytes) back to the host and checks that every byte is `value`.
::testing::AssertionResult reads_as(const void* ptr, std::size_t bytes, unsigned char value) {
  std::vector<unsigned char> back(bytes);
  if (cudaError_t rc = cudaMemcpy(back.data(), ptr, bytes, cudaMemcpyDefault); rc != cudaSuccess) {
    return ::testing::AssertionFailure() << "cudaMemcpy from the memory: " << cudaGetErrorName(rc);
  }
  for (std::size_t i = 0; i < bytes; ++i) {
    if (back[i] != value) {
      return ::testing::AssertionFailure()
             << "byte " << i << " is " << int(back[i]) << ", not " << int(value);
    }
  }
  return ::testing::AssertionSuccess();
}

// Copies `value` into [ptr, ptr + bytes) and back through the CUDA copy engine
// (cudaMemcpyDefault works for device and pinned host memory alike) and compares.
::testing::AssertionResult holds_pattern(void* ptr, std::size_t bytes, unsigned char value) {
  std::vector<unsigned char> out(bytes, value);
  if (cudaError_t rc = cudaMemcpy(ptr, out.data(), bytes, cudaMemcpyDefault); rc != cudaSuccess) {
    return ::testing::AssertionFailure() << "cudaMemcpy to the memory: " << cudaGetErrorName(rc);
  }
  return reads_as(ptr, bytes, value);
}

struct CudaConfig {
  static std::unique_ptr<MemoryResource> make() { return std::make_unique<CudaResource>(0); }
};
struct CudaAsyncConfig {
  static std::unique_ptr<MemoryResource> make() { return std::make_unique<CudaAsyncResource>(0); }
};
struct PinnedHostConfig {
  static std::unique_ptr<MemoryResource> make() { return std::make_unique<PinnedHostResource>(); }
};

template <typename Config>
class CudaResourceConformance : public ::testing::Test {
 protected:
  void SetUp() override {
    SDALLOC_REQUIRE_CUDA_DEVICE();
    resource_ = Config::make();
  }
  void TearDown() override {
    if (!resource_) return;  // skipped
    resource_.reset();
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "an error was left for cudaGetLastError";
  }
  std::unique_ptr<MemoryResource> resource_;
};

using Configs = ::testing::Types<CudaConfig, CudaAsyncConfig, PinnedHostConfig>;
TYPED_TEST_SUITE(CudaResourceConformance, Configs);

TYPED_TEST(CudaResourceConformance, ResultsAreAlignedUsableAndDisjoint) {
  MemoryResource& r = *this->resource_;
  std::vector<std::pair<void*, std::size_t>> held;
  for (std::size_t bytes :
       {std::size_t{1}, std::size_t{255}, std::size_t{4096}, kMiB + 3, 8 * kMiB}) {
    void* p = r.allocate(bytes);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % kMinAlignment, 0u);
    EXPECT_TRUE(holds_pattern(p, bytes, static_cast<unsigned char>(held.size() + 1)));
    held.emplace_back(p, bytes);
  }
  for (std::size_t i = 0; i < held.size(); ++i) {
    for (std::size_t j = i + 1; j < held.size(); ++j) {
      const auto a = reinterpret_cast<std::uintptr_t>(held[i].first);
      const auto b = reinterpret_cast<std::uintptr_t>(held[j].first);
      EXPECT_TRUE(a + held[i].second <= b || b + held[j].second <= a) << "overlap";
    }
  }
  for (auto [p, bytes] : held) r.deallocate(p, bytes);
}

TYPED_TEST(CudaResourceConformance, ZeroBytesIsNullAndFreeingNullIsANoOp) {
  EXPECT_EQ(this->resource_->allocate(0), nullptr);
  this->resource_->deallocate(nullptr, 0);
}

TYPED_TEST(CudaResourceConformance, HugeRequestIsOutOfMemoryAndChangesNothing) {
  MemoryResource& r = *this->resource_;
  try {
    (void)r.allocate(std::size_t{1} << 52);
    FAIL() << "a 4 PiB request succeeded";
  } catch (const OutOfMemory& e) {
    EXPECT_EQ(e.info.requested, std::size_t{1} << 52);
    EXPECT_TRUE(Contains(e.what(), r.name()));
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the failure must not linger";
  void* p = r.allocate(kMiB);
  EXPECT_TRUE(holds_pattern(p, kMiB, 7));
  r.deallocate(p, kMiB);
}

TYPED_TEST(CudaResourceConformance, ManyThreadsAllocateAndFreeAtOnce) {
  MemoryResource& r = *this->resource_;
  std::vector<std::thread> threads;
  threads.reserve(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&r, t] {
      for (int i = 0; i < 50; ++i) {
        const std::size_t bytes = (static_cast<std::size_t>(i % 7) + 1) * 64 * 1024;
        void* p = r.allocate(bytes);
        EXPECT_NE(p, nullptr);
        EXPECT_TRUE(holds_pattern(p, bytes, static_cast<unsigned char>(t + 1)));
        r.deallocate(p, bytes);
      }
    });
  }
  for (auto& th : threads) th.join();
}

TYPED_TEST(CudaResourceConformance, FreeOnAnotherStreamIsAccepted) {
  test::OwnedStream s1;
  test::OwnedStream s2;
  ASSERT_TRUE(s1.ok() && s2.ok());
  MemoryResource& r = *this->resource_;
  void* p = r.allocate(kMiB, Stream::from_native(s1.get()));
  ASSERT_EQ(cudaStreamSynchronize(s1.get()), cudaSuccess);
  EXPECT_TRUE(holds_pattern(p, kMiB, 1));
  r.deallocate(p, kMiB, Stream::from_native(s2.get()));
  ASSERT_EQ(cudaStreamSynchronize(s2.get()), cudaSuccess);
}

TEST(CudaResource, ReportsTheDeviceAndItsMemory) {
  SDALLOC_REQUIRE_CUDA_DEVICE();
  CudaResource r(0);
  EXPECT_EQ(r.name(), "cuda(0)");
  EXPECT_EQ(r.device(), 0);
  std::size_t free = 0;
  std::size_t total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  EXPECT_EQ(r.capacity(), total);
}

TEST(CudaResource, RestoresTheCallersDevice) {
  SDALLOC_REQUIRE_CUDA_DEVICE();
  if (device_count() < 2) GTEST_SKIP() << "needs two CUDA devices";
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  CudaResource r(1);
  void* p = r.allocate(kMiB);
  cudaPointerAttributes attributes{};
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, p), cudaSuccess);
  EXPECT_EQ(attributes.device, 1);
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, 0);
  r.deallocate(p, kMiB);
}

TEST(CudaAsyncResource, KeepsFreedMemoryAcrossASynchronize) {
  SDALLOC_REQUIRE_CUDA_DEVICE();
  CudaAsyncResource r(0);
  void* p = r.allocate(64 * kMiB);
  r.deallocate(p, 64 * kMiB);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_GE(r.reserved_bytes(), 64 * kMiB) << "the release threshold must keep the cache";
  r.trim(0);
  EXPECT_EQ(r.reserved_bytes(), 0u);
}

TEST(CudaAsyncResource, ZeroThresholdTrimsAtSynchronize) {
  SDALLOC_REQUIRE_CUDA_DEVICE();
  CudaAsyncResourceOptions options;
  options.release_threshold = 0;
  CudaAsyncResource r(0, options);
  void* p = r.allocate(64 * kMiB);
  r.deallocate(p, 64 * kMiB);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(r.reserved_bytes(), 0u);
}

TEST(CudaAsyncResource, InitialPoolSizeIsReservedUpFront) {
  SDALLOC_REQUIRE_CUDA_DEVICE();
  CudaAsyncResourceOptions options;
  options.initial_pool_size = 32 * kMiB;
  CudaAsyncResource r(0, options);
  EXPECT_GE(r.reserved_bytes(), 32 * kMiB);
}

TEST(CudaAsyncResource, FreeIsOrderedOnItsStream) {
  // Freed on s while s is held busy: the memory goes back only when s gets there, and
  // reallocating it on s is safe at once (later work on s runs after the free).
  SDALLOC_REQUIRE_CUDA_DEVICE();
  test::OwnedStream s;
  ASSERT_TRUE(s.ok());
  CudaAsyncResource r(0);
  const Stream stream = Stream::from_native(s.get());
  test::StreamGate gate(s.get());
  ASSERT_EQ(gate.close(), cudaSuccess);
  void* p = r.allocate(kMiB, stream);
  ASSERT_EQ(cudaMemsetAsync(p, 3, kMiB, s.get()), cudaSuccess);
  r.deallocate(p, kMiB, stream);
  void* q = r.allocate(kMiB, stream);
  ASSERT_EQ(cudaMemsetAsync(q, 4, kMiB, s.get()), cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(s.get()), cudaErrorNotReady);
  (void)cudaGetLastError();
  gate.open();
  ASSERT_EQ(cudaStreamSynchronize(s.get()), cudaSuccess);
  EXPECT_TRUE(reads_as(q, kMiB, 4)) << "work on the stream ran in order";
  r.deallocate(q, kMiB, stream);
}

TEST(PinnedHostResource, MemoryIsPageLockedHostMemory) {
  SDALLOC_REQUIRE_CUDA_DEVICE();
  PinnedHostResource r;
  void* p = r.allocate(kMiB);
  cudaPointerAttributes attributes{};
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, p), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeHost);
  std::memset(p, 9, kMiB);  // host-accessible
  r.deallocate(p, kMiB);
}

TEST(PinnedHostRegistration, PinsExistingMemoryWhileItLives) {
  SDALLOC_REQUIRE_CUDA_DEVICE();
  std::vector<unsigned char> buffer(4 * kMiB, 1);
  {
    PinnedHostRegistration pin(buffer.data(), buffer.size());
    cudaPointerAttributes attributes{};
    ASSERT_EQ(cudaPointerGetAttributes(&attributes, buffer.data()), cudaSuccess);
    EXPECT_EQ(attributes.type, cudaMemoryTypeHost);
    EXPECT_THROW(PinnedHostRegistration(buffer.data(), buffer.size()), InvalidArgument)
        << "registering twice";
    PinnedHostRegistration moved = std::move(pin);
    EXPECT_EQ(moved.data(), buffer.data());
    EXPECT_EQ(pin.data(), nullptr);  // NOLINT(bugprone-use-after-move): checks the move
  }
  // Unregistered again: a new registration succeeds.
  PinnedHostRegistration again(buffer.data(), buffer.size());
  EXPECT_EQ(again.size(), buffer.size());
}

TEST(DeviceBackend, ServesEveryModeFromTheDevicesMemory) {
  SDALLOC_REQUIRE_CUDA_DEVICE();
  for (PoolMode mode : {PoolMode::kPool, PoolMode::kAsync, PoolMode::kVmm}) {
    SCOPED_TRACE(to_string(mode));
    PoolConf conf;
    conf.mode = mode;
    std::unique_ptr<PoolStack> stack =
        make_pool(conf, device_backend(0, {.async_segments = mode == PoolMode::kAsync}));
    AnyPool& pool = *stack->pool;
    void* p = pool.allocate(3 * kMiB, kPoolRounding, kDefaultStream);
    EXPECT_TRUE(holds_pattern(p, 3 * kMiB, 11));
    pool.deallocate(p, 3 * kMiB, kDefaultStream);
    EXPECT_EQ(pool.stats().live_bytes, 0u);
  }
}

}  // namespace
}  // namespace sdalloc::cuda
