// CudaVirtualMemory with the real driver (skipped where there is no device): reserve,
// create, map with access, data that survives an unmap and a remap elsewhere, the wait for
// queued work before unmap, rejected misuse, out-of-memory for an impossible chunk, and a
// pool over VirtualMemoryResource growing its arena on the device.
// The rollback and error paths that a healthy driver never takes are covered by
// driver_virtual_memory_test.cpp against a simulated driver.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <thread>
#include <vector>

#include "cuda_device_check.hpp"
#include "sdalloc/config/make_pool.hpp"
#include "sdalloc/core/errors.hpp"
#include "sdalloc/cuda/cuda_virtual_memory.hpp"
#include "sdalloc/cuda/device_resource.hpp"
#include "stream_gate.hpp"

namespace sdalloc::cuda {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

::testing::AssertionResult reads_as(const void* ptr, std::size_t bytes, unsigned char value) {
  std::vector<unsigned char> back(bytes);
  if (cudaMemcpy(back.data(), ptr, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
    return ::testing::AssertionFailure() << "cudaMemcpy failed";
  }
  for (std::size_t i = 0; i < bytes; ++i) {
    if (back[i] != value) return ::testing::AssertionFailure() << "byte " << i << " differs";
  }
  return ::testing::AssertionSuccess();
}

class CudaVirtualMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SDALLOC_REQUIRE_CUDA_DEVICE();
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    vm_ = std::make_unique<CudaVirtualMemory>(0);
    g_ = vm_->granularity();
  }
  static char* at(void* base, std::size_t offset) { return static_cast<char*>(base) + offset; }

  std::unique_ptr<CudaVirtualMemory> vm_;
  std::size_t g_ = 0;
};

TEST_F(CudaVirtualMemoryTest, GranularityIsAPowerOfTwoOfAtLeast64KiB) {
  EXPECT_GE(g_, std::size_t{64} << 10);
  EXPECT_EQ(g_ & (g_ - 1), 0u);
  EXPECT_GT(vm_->physical_capacity(), 0u);
  EXPECT_EQ(vm_->name(), "cuda-vm(device 0)");
}

TEST_F(CudaVirtualMemoryTest, MappedChunksHoldDataAcrossARemap) {
  void* base = vm_->reserve(4 * g_);
  const PhysicalChunk a = vm_->create(g_);
  const PhysicalChunk b = vm_->create(2 * g_);
  vm_->map(base, a);
  vm_->map(at(base, 2 * g_), b);
  EXPECT_EQ(vm_->mapped_bytes(), 3 * g_);
  ASSERT_EQ(cudaMemset(base, 0x5a, g_), cudaSuccess);
  ASSERT_EQ(cudaMemset(at(base, 2 * g_), 0x3c, 2 * g_), cudaSuccess);
  EXPECT_TRUE(reads_as(base, g_, 0x5a));

  vm_->unmap(base, g_, Stream{});
  vm_->map(at(base, g_), a);  // the same chunk, one granule further
  EXPECT_TRUE(reads_as(at(base, g_), g_, 0x5a)) << "a chunk keeps its contents when remapped";
  EXPECT_TRUE(reads_as(at(base, 2 * g_), 2 * g_, 0x3c));

  vm_->unmap(at(base, g_), g_, Stream{});
  vm_->unmap(at(base, 2 * g_), 2 * g_, Stream{});
  vm_->destroy(a);
  vm_->destroy(b);
  vm_->release(base, 4 * g_);
  EXPECT_EQ(vm_->mapped_bytes() + vm_->physical_bytes() + vm_->reserved_bytes(), 0u);
}

TEST_F(CudaVirtualMemoryTest, UnmapWaitsForQueuedWork) {
  test::OwnedStream s;
  ASSERT_TRUE(s.ok());
  void* base = vm_->reserve(g_);
  const PhysicalChunk chunk = vm_->create(g_);
  vm_->map(base, chunk);
  test::StreamGate gate(s.get());
  ASSERT_EQ(gate.close(), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(base, 1, g_, s.get()), cudaSuccess);  // waits behind the gate

  std::atomic<bool> unmapped{false};
  std::thread unmapper([&] {
    vm_->unmap(base, g_, Stream::from_native(s.get()));
    unmapped = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(unmapped.load()) << "unmapped while work queued before it had not run";
  gate.open();
  unmapper.join();
  EXPECT_TRUE(unmapped.load());
  EXPECT_EQ(cudaStreamQuery(s.get()), cudaSuccess);
  vm_->destroy(chunk);
  vm_->release(base, g_);
}

TEST_F(CudaVirtualMemoryTest, MisuseIsRejectedBeforeTheDriver) {
  void* base = vm_->reserve(2 * g_);
  const PhysicalChunk chunk = vm_->create(g_);
  vm_->map(base, chunk);
  EXPECT_THROW(vm_->map(at(base, g_), chunk), InvalidArgument);
  EXPECT_THROW(vm_->destroy(chunk), InvalidArgument);
  EXPECT_THROW(vm_->release(base, 2 * g_), InvalidArgument);
  EXPECT_THROW((void)vm_->create(g_ / 2), InvalidArgument);
  vm_->unmap(base, g_, Stream{});
  vm_->destroy(chunk);
  vm_->release(base, 2 * g_);
}

TEST_F(CudaVirtualMemoryTest, ImpossibleChunkIsOutOfMemory) {
  const std::size_t too_big = (vm_->physical_capacity() / g_ + 1) * g_ * 4;
  EXPECT_THROW((void)vm_->create(too_big), OutOfMemory);
  EXPECT_EQ(vm_->physical_bytes(), 0u);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST_F(CudaVirtualMemoryTest, DestructorFreesWhatIsLeft) {
  void* base = vm_->reserve(2 * g_);
  vm_->map(base, vm_->create(g_));
  (void)vm_->create(g_);
  std::size_t free_before = 0;
  std::size_t total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_before, &total), cudaSuccess);
  vm_.reset();
  std::size_t free_after = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_after, &total), cudaSuccess);
  EXPECT_GE(free_after, free_before + 2 * g_);
}

// The pool make_pool() builds on a device by default: a VirtualMemoryPool over its cuMem
// memory, whose pages hold what was written through every later request.
TEST(CudaDeviceBackend, TheDefaultPoolOnADeviceMapsPages) {
  SDALLOC_REQUIRE_CUDA_DEVICE();
  std::unique_ptr<PoolStack> stack = make_pool(PoolConf{}, device_backend(0));
  ASSERT_EQ(stack->mode, PoolMode::kVmm);
  AnyPool& pool = *stack->pool;
  void* low = pool.allocate(kMiB, kPoolRounding, kDefaultStream);
  ASSERT_EQ(cudaMemset(low, 0x3c, kMiB), cudaSuccess);
  void* big = pool.allocate(16 * kMiB, kPoolRounding, kDefaultStream);
  ASSERT_EQ(cudaMemset(big, 0x4d, 16 * kMiB), cudaSuccess);
  EXPECT_TRUE(reads_as(low, kMiB, 0x3c));
  EXPECT_TRUE(reads_as(big, 16 * kMiB, 0x4d));
  pool.free(big, kDefaultStream);
  pool.free(low, kDefaultStream);
  pool.check_invariants();
}

TEST(CudaVirtualMemoryPeers, BadPeersAreRejected) {
  SDALLOC_REQUIRE_CUDA_DEVICE();
  CudaVirtualMemoryOptions self;
  self.peer_devices = {0};
  EXPECT_THROW(CudaVirtualMemory vm(0, self), InvalidArgument);
  CudaVirtualMemoryOptions missing;
  missing.peer_devices = {device_count()};
  EXPECT_THROW(CudaVirtualMemory vm(0, missing), InvalidArgument);
}

}  // namespace
}  // namespace sdalloc::cuda
