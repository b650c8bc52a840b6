// DriverVirtualMemory - the logic of CudaVirtualMemory - against a simulated driver: the
// order of cuMem* calls, access for the device and its peers, the wait before cuMemUnmap,
// rollback of a map whose access step fails, out-of-memory reports, the interface's rules,
// and cleanup of what a caller leaves behind. Real cuMem* calls are exercised by
// cuda_virtual_memory_test.cpp on a machine with a GPU.
#include <gtest/gtest.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "driver_virtual_memory.hpp"
#include "fake_driver.hpp"
#include "sdalloc/core/errors.hpp"
#include "sdalloc/cuda/cuda_error.hpp"
#include "support/test_support.hpp"

namespace sdalloc::cuda {
namespace {

using sdalloc::test::Contains;
using test::FakeDriver;

constexpr std::size_t kG = FakeDriver::kGranularity;

class DriverVirtualMemoryTest : public ::testing::Test {
 protected:
  std::unique_ptr<DriverVirtualMemory> make(UnmapWait wait = UnmapWait::kDevice,
                                            std::vector<int> devices = {0}) {
    return std::make_unique<DriverVirtualMemory>(driver_.api(), devices.front(), devices, wait,
                                                 std::size_t{80} << 30, "cuda-vm(device 0)");
  }
  static void* at(void* base, std::size_t offset) { return static_cast<char*>(base) + offset; }

  FakeDriver driver_;
};

TEST_F(DriverVirtualMemoryTest, GranularityComesFromTheDriver) {
  auto vm = make();
  EXPECT_EQ(vm->granularity(), kG);
  EXPECT_EQ(vm->physical_capacity(), std::size_t{80} << 30);
}

TEST_F(DriverVirtualMemoryTest, MapGivesTheDeviceAndItsPeersAccess) {
  auto vm = make(UnmapWait::kDevice, {1, 0, 3});
  void* base = vm->reserve(4 * kG, 0);
  const PhysicalChunk chunk = vm->create(2 * kG);
  vm->map(at(base, kG), chunk);
  const auto ptr = reinterpret_cast<CUdeviceptr>(at(base, kG));
  ASSERT_EQ(driver_.access.count(ptr), 1u);
  EXPECT_EQ(driver_.access[ptr], (std::vector<int>{1, 0, 3}));
  EXPECT_EQ(vm->mapped_bytes(), 2 * kG);
  EXPECT_EQ(vm->physical_bytes(), 2 * kG);
  EXPECT_EQ(vm->reserved_bytes(), 4 * kG);
  vm->unmap(at(base, kG), 2 * kG, Stream{});
  vm->destroy(chunk);
  vm->release(base, 4 * kG);
  EXPECT_TRUE(driver_.ranges.empty() && driver_.chunks.empty() && driver_.mappings.empty());
  EXPECT_EQ(vm->mapped_bytes() + vm->physical_bytes() + vm->reserved_bytes(), 0u);
}

TEST_F(DriverVirtualMemoryTest, UnmapSynchronizesTheDeviceFirst) {
  auto vm = make();
  void* base = vm->reserve(2 * kG, 0);
  const PhysicalChunk chunk = vm->create(kG);
  vm->map(base, chunk);
  driver_.log.clear();
  vm->unmap(base, kG, Stream{0x77});
  EXPECT_EQ(driver_.log, (std::vector<std::string>{"sync_device 0", "cuMemUnmap"}));
  vm->destroy(chunk);
  vm->release(base, 2 * kG);
}

TEST_F(DriverVirtualMemoryTest, UnmapCanWaitForItsStreamOnly) {
  auto vm = make(UnmapWait::kStream);
  void* base = vm->reserve(2 * kG, 0);
  const PhysicalChunk chunk = vm->create(kG);
  vm->map(base, chunk);
  driver_.log.clear();
  vm->unmap(base, kG, Stream{0x77});
  EXPECT_EQ(driver_.log, (std::vector<std::string>{"sync_stream 119", "cuMemUnmap"}));
  vm->destroy(chunk);
  vm->release(base, 2 * kG);
}

TEST_F(DriverVirtualMemoryTest, FailedWaitKeepsTheMapping) {
  auto vm = make();
  void* base = vm->reserve(2 * kG, 0);
  const PhysicalChunk chunk = vm->create(kG);
  vm->map(base, chunk);
  driver_.fail_next("sync_device", cudaErrorLaunchFailure);
  try {
    vm->unmap(base, kG, Stream{});
    FAIL() << "unmap succeeded although waiting for the device failed";
  } catch (const CudaError& e) {
    EXPECT_EQ(e.call, "cudaDeviceSynchronize");
    EXPECT_TRUE(Contains(e.what(), "cudaErrorLaunchFailure"));
  }
  EXPECT_EQ(driver_.mappings.size(), 1u) << "nothing may be unmapped before the wait succeeded";
  EXPECT_EQ(vm->mapped_bytes(), kG);
  vm->unmap(base, kG, Stream{});  // the retry works
  vm->destroy(chunk);
  vm->release(base, 2 * kG);
}

TEST_F(DriverVirtualMemoryTest, MapRollsBackWhenAccessCannotBeGiven) {
  auto vm = make();
  void* base = vm->reserve(2 * kG, 0);
  const PhysicalChunk chunk = vm->create(kG);
  driver_.fail_next("cuMemSetAccess", CUDA_ERROR_INVALID_VALUE);
  driver_.log.clear();
  try {
    vm->map(base, chunk);
    FAIL() << "map succeeded although cuMemSetAccess failed";
  } catch (const CudaError& e) {
    EXPECT_EQ(e.call, "cuMemSetAccess");
    EXPECT_EQ(e.code, CUDA_ERROR_INVALID_VALUE);
    EXPECT_TRUE(Contains(e.what(),
                         "cuda-vm(device 0): cuMemSetAccess failed: "
                         "CUDA_ERROR_INVALID_VALUE (simulated failure)"));
    EXPECT_TRUE(Contains(e.what(), "was removed again"));
  }
  EXPECT_EQ(driver_.log, (std::vector<std::string>{"cuMemMap", "cuMemSetAccess", "cuMemUnmap"}));
  EXPECT_TRUE(driver_.mappings.empty()) << "the partial map must be rolled back";
  EXPECT_EQ(vm->mapped_bytes(), 0u);
  // Nothing is left half-done: the chunk maps at the same place on the next try.
  vm->map(base, chunk);
  EXPECT_EQ(vm->mapped_bytes(), kG);
  vm->unmap(base, kG, Stream{});
  vm->destroy(chunk);
  vm->release(base, 2 * kG);
}

TEST_F(DriverVirtualMemoryTest, FailedRollbackIsReportedAndCleanedUpAtTheEnd) {
  auto vm = make();
  void* base = vm->reserve(2 * kG, 0);
  const PhysicalChunk chunk = vm->create(kG);
  driver_.fail_next("cuMemSetAccess", CUDA_ERROR_INVALID_VALUE);
  driver_.fail_next("cuMemUnmap", CUDA_ERROR_OUT_OF_MEMORY);
  try {
    vm->map(base, chunk);
    FAIL() << "map succeeded although cuMemSetAccess failed";
  } catch (const CudaError& e) {
    EXPECT_TRUE(Contains(e.what(), "removing the mapping"));
    EXPECT_TRUE(Contains(e.what(), "failed too: CUDA_ERROR_OUT_OF_MEMORY"));
  }
  EXPECT_EQ(driver_.mappings.size(), 1u);
  EXPECT_EQ(vm->mapped_bytes(), kG) << "the figures say what still exists";
  vm.reset();
  EXPECT_TRUE(driver_.ranges.empty() && driver_.chunks.empty() && driver_.mappings.empty())
      << "the destructor unmaps, destroys and releases what is left";
}

TEST_F(DriverVirtualMemoryTest, FailedMapLeavesNothingMapped) {
  auto vm = make();
  void* base = vm->reserve(2 * kG, 0);
  const PhysicalChunk chunk = vm->create(kG);
  driver_.fail_next("cuMemMap", CUDA_ERROR_INVALID_VALUE);
  EXPECT_THROW(vm->map(base, chunk), CudaError);
  EXPECT_EQ(vm->mapped_bytes(), 0u);
  vm->map(base, chunk);
  vm->unmap(base, kG, Stream{});
  vm->destroy(chunk);
  vm->release(base, 2 * kG);
}

TEST_F(DriverVirtualMemoryTest, OutOfDeviceMemoryIsOutOfMemory) {
  auto vm = make();
  driver_.fail_next("cuMemCreate", CUDA_ERROR_OUT_OF_MEMORY);
  try {
    (void)vm->create(4 * kG);
    FAIL() << "create succeeded although the driver had no memory";
  } catch (const OutOfMemory& e) {
    EXPECT_EQ(e.info.requested, 4 * kG);
    EXPECT_EQ(e.info.capacity, std::size_t{80} << 30);
    EXPECT_TRUE(Contains(e.what(), "cuMemCreate reported CUDA_ERROR_OUT_OF_MEMORY"));
  }
  EXPECT_EQ(vm->physical_bytes(), 0u);
  driver_.fail_next("cuMemAddressReserve", CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_THROW((void)vm->reserve(kG, 0), OutOfMemory);
  EXPECT_EQ(vm->reserved_bytes(), 0u);
  void* base = vm->reserve(kG, 0);
  const PhysicalChunk chunk = vm->create(kG);
  driver_.fail_next("cuMemMap", CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_THROW(vm->map(base, chunk), OutOfMemory);
  EXPECT_EQ(vm->mapped_bytes(), 0u);
}

TEST_F(DriverVirtualMemoryTest, OtherDriverFailuresAreCudaErrors) {
  auto vm = make();
  driver_.fail_next("cuMemCreate", CUDA_ERROR_INVALID_VALUE);
  try {
    (void)vm->create(kG);
    FAIL();
  } catch (const CudaError& e) {
    EXPECT_EQ(e.call, "cuMemCreate");
    EXPECT_TRUE(Contains(e.what(), "creating 2097152 B"));
  }
  const PhysicalChunk chunk = vm->create(kG);
  driver_.fail_next("cuMemRelease", CUDA_ERROR_INVALID_VALUE);
  EXPECT_THROW(vm->destroy(chunk), CudaError);
  EXPECT_EQ(vm->physical_bytes(), kG) << "a chunk that could not be freed is still listed";
  vm->destroy(chunk);
  EXPECT_EQ(vm->physical_bytes(), 0u);
}

TEST_F(DriverVirtualMemoryTest, SizesMustBeMultiplesOfTheGranularity) {
  auto vm = make();
  EXPECT_THROW((void)vm->reserve(0, 0), InvalidArgument);
  EXPECT_THROW((void)vm->reserve(kG + 4096, 0), InvalidArgument);
  EXPECT_THROW((void)vm->reserve(kG, 3 * kG), InvalidArgument);
  EXPECT_THROW((void)vm->create(0), InvalidArgument);
  EXPECT_THROW((void)vm->create(kG / 2), InvalidArgument);
  EXPECT_TRUE(driver_.log.size() == 1) << "only the granularity query reached the driver";
}

TEST_F(DriverVirtualMemoryTest, ReserveHonoursLargerAlignments) {
  auto vm = make();
  void* base = vm->reserve(kG, 64 * kG);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(base) % (64 * kG), 0u);
  vm->release(base, kG);
}

TEST_F(DriverVirtualMemoryTest, RuleBreakingCallsAreRejectedBeforeTheDriver) {
  auto vm = make();
  void* base = vm->reserve(4 * kG, 0);
  const PhysicalChunk a = vm->create(2 * kG);
  const PhysicalChunk b = vm->create(kG);
  vm->map(base, a);
  driver_.log.clear();

  EXPECT_THROW(vm->map(at(base, kG), b), InvalidArgument) << "over a mapping";
  EXPECT_THROW(vm->map(at(base, 4096), b), InvalidArgument) << "misaligned offset";
  EXPECT_THROW(vm->map(at(base, 4 * kG), b), InvalidArgument) << "outside the range";
  EXPECT_THROW(vm->map(at(base, 3 * kG), PhysicalChunk{a.handle, a.bytes}), InvalidArgument)
      << "a chunk mapped elsewhere";
  EXPECT_THROW(vm->map(at(base, 3 * kG), PhysicalChunk{b.handle, 2 * kG}), InvalidArgument)
      << "the wrong size";
  EXPECT_THROW(vm->map(at(base, 3 * kG), PhysicalChunk{999, kG}), InvalidArgument)
      << "an unknown chunk";
  EXPECT_THROW(vm->unmap(at(base, kG), kG, Stream{}), InvalidArgument) << "inside a mapping";
  EXPECT_THROW(vm->unmap(base, kG, Stream{}), InvalidArgument) << "part of a mapping";
  EXPECT_THROW(vm->destroy(a), InvalidArgument) << "a mapped chunk";
  EXPECT_THROW(vm->destroy(PhysicalChunk{999, kG}), InvalidArgument);
  EXPECT_THROW(vm->release(base, 4 * kG), InvalidArgument) << "a range with mappings";
  EXPECT_THROW(vm->release(base, 2 * kG), InvalidArgument) << "the wrong size";
  EXPECT_TRUE(driver_.log.empty()) << "a rejected call must not reach the driver";

  try {
    vm->map(at(base, kG), b);
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(Contains(e.what(), "already mapped"));
  }
  vm->map(at(base, 3 * kG), b);  // still consistent and usable
  EXPECT_EQ(vm->mapped_bytes(), 3 * kG);
}

TEST_F(DriverVirtualMemoryTest, DestructorCleansUpInTheDriversOrder) {
  auto vm = make();
  void* base = vm->reserve(4 * kG, 0);
  vm->map(base, vm->create(kG));
  (void)vm->create(kG);  // spare
  driver_.log.clear();
  vm.reset();
  EXPECT_EQ(driver_.log, (std::vector<std::string>{"sync_device 0", "cuMemUnmap", "cuMemRelease",
                                                   "cuMemRelease", "cuMemAddressFree"}));
  EXPECT_TRUE(driver_.ranges.empty() && driver_.chunks.empty() && driver_.mappings.empty());
}

TEST_F(DriverVirtualMemoryTest, BadGranularityFromTheDriverIsReported) {
  driver_.fail_next("cuMemGetAllocationGranularity", CUDA_ERROR_INVALID_VALUE);
  EXPECT_THROW(make(), CudaError);
}

}  // namespace
}  // namespace sdalloc::cuda
