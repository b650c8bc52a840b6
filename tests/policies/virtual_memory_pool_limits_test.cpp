// virtual_memory_pool_limits_test.cpp - VirtualMemoryPool at the system's limits: the
// kernel's mapping count (issue 15, F3) and requests beyond any memory (F4).
//
// F3: every kernel mapping counts against vm.max_map_count (65,530); the pool maps the
// fresh chunks of a block at increasing addresses, so HostVirtualMemory's mappings merge
// into few, and a rollback whose unmap fails keeps the page mapped instead of throwing from
// inside the rollback. F4: a request with more pages than can ever exist is
// refused at once. The pages are never written here, so gigabytes cost no memory.
#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <fstream>
#include <string>
#include <vector>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/policies/virtual_memory_pool.hpp"
#include "sdalloc/resources/host_virtual_memory.hpp"
#include "support/failing_virtual_memory.hpp"
#include "support/test_support.hpp"

namespace sdalloc {
namespace {

using test::Contains;
using test::FailingVirtualMemory;
using Step = FailingVirtualMemory::Step;
using Failure = FailingVirtualMemory::Failure;

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kGiB = std::size_t{1} << 30;
constexpr std::size_t kPage = 64 * 1024;      // the default page size on the host
constexpr std::size_t kBlock = 3 * kMiB / 2;  // a block of exactly 24 pages

// The process's kernel mappings now: one line of /proc/self/maps each.
std::size_t kernel_mappings() {
  std::ifstream maps("/proc/self/maps");
  std::size_t lines = 0;
  for (std::string line; std::getline(maps, line);) ++lines;
  return lines;
}

// ---- F3: the mapping count -------------------------------------------------------------

TEST(VirtualMemoryPoolLimits, F3FourGiBAllocationIsAFewKernelMappingsAndTheNextRequestWorks) {
  HostVirtualMemory memory;
  VirtualMemoryPool pool(memory);
  const std::size_t before = kernel_mappings();
  void* big = pool.allocate(4 * kGiB);  // 65,536 pages: over the limit, one mapping each
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(pool.vm_stats().mapped_bytes, 4 * kGiB);
  // Without merging 65,536 more; the margin is for the sanitizers' own runtime mappings.
  EXPECT_LT(kernel_mappings(), before + 1024) << "adjacent chunks must share a kernel mapping";
  void* small = pool.allocate(kMiB);
  ASSERT_NE(small, nullptr);
  pool.free(big);
  pool.free(small);
  EXPECT_GE(pool.trim(), 4 * kGiB);
  EXPECT_EQ(memory.mapped_bytes(), 0u);
  EXPECT_EQ(memory.physical_bytes(), 0u);
  EXPECT_LT(kernel_mappings(), before + 1024);
  EXPECT_NO_THROW(pool.check_invariants());
}

TEST(VirtualMemoryPoolLimits, F3EightGiBInManyAllocationsStaysFarBelowTheMappingLimit) {
  HostVirtualMemory memory;
  VirtualMemoryPool pool(memory);
  const std::size_t before = kernel_mappings();
  std::vector<void*> held;
  for (int i = 0; i < 128; ++i) held.push_back(pool.allocate(64 * kMiB));  // 8 GiB
  EXPECT_EQ(pool.vm_stats().mapped_bytes, 8 * kGiB);
  // 131,072 pages; without merging each would be a mapping (twice the limit).
  EXPECT_LT(kernel_mappings(), before + 256);
  // Every other one freed and a request that needs their pages stitched together: the
  // moved pages cost mappings, but far fewer than pages.
  for (std::size_t i = 0; i < held.size(); i += 2) pool.free(held[i]);
  void* stitched = pool.allocate(4 * kGiB);
  ASSERT_NE(stitched, nullptr);
  EXPECT_LT(kernel_mappings(), before + 1024);
  pool.free(stitched);
  for (std::size_t i = 1; i < held.size(); i += 2) pool.free(held[i]);
  EXPECT_NO_THROW(pool.check_invariants());
}

// Where the memory maps a run of pages in one call, a refused run maps nothing: the request
// fails with that error, the pool keeps no page of it, and the next request is served.
TEST(VirtualMemoryPoolLimits, ARefusedRunOfPagesLeavesNothingMapped) {
  HostVirtualMemory real;
  FailingVirtualMemory memory(real, /*runs=*/true);
  ASSERT_TRUE(memory.maps_runs());
  VirtualMemoryPool pool(memory);
  memory.fail(Step::kMap, 0);
  EXPECT_THROW((void)pool.allocate(kBlock), OutOfMemory);
  EXPECT_EQ(memory.calls(Step::kMap), 1u) << "the block's 24 pages are one run, one call";
  EXPECT_NO_THROW(pool.check_invariants());
  EXPECT_EQ(pool.vm_stats().mapped_bytes, 0u);
  EXPECT_EQ(real.mapped_bytes(), 0u);
  void* ptr = pool.allocate(kBlock);
  ASSERT_NE(ptr, nullptr);
  EXPECT_EQ(real.mapped_bytes(), kBlock);
  EXPECT_EQ(memory.calls(Step::kMap), 2u);
  pool.free(ptr);
  EXPECT_NO_THROW(pool.check_invariants());
}

TEST(VirtualMemoryPoolLimits, F3RollbackKeepsAPageWhoseUnmapFailsAndThrowsTheMapsError) {
  HostVirtualMemory real;
  FailingVirtualMemory memory(real);
  VirtualMemoryPool pool(memory);
  memory.fail(Step::kMap, 5);  // the 6th page of 24: OutOfMemory, as at the mapping limit
  memory.fail(Step::kUnmap, 0, Failure::kError, /*persistent=*/true);
  try {
    (void)pool.allocate(kBlock);
    ADD_FAILURE() << "the map failure must reach the caller";
  } catch (const OutOfMemory& e) {
    EXPECT_TRUE(Contains(e.what(), "injected map failure")) << e.what();
  }
  EXPECT_TRUE(memory.fired(Step::kUnmap));
  EXPECT_NO_THROW(pool.check_invariants());
  EXPECT_EQ(pool.stats().live_bytes, 0u);
  EXPECT_EQ(pool.stats().live_allocations, 0u);
  // The five pages that could not be unmapped stay mapped under free space, held by the
  // pool; the chunks created for the other pages are destroyed again.
  EXPECT_EQ(pool.vm_stats().mapped_bytes, 5 * kPage);
  EXPECT_EQ(real.mapped_bytes(), 5 * kPage);
  EXPECT_EQ(real.physical_bytes(), 5 * kPage);

  memory.fail(Step::kMap, 2, Failure::kError);  // an Error is named, not the unmap's
  try {
    (void)pool.allocate(2 * kBlock);
    ADD_FAILURE() << "the map failure must reach the caller";
  } catch (const OutOfMemory& e) {
    ADD_FAILURE() << "not a lack of memory: " << e.what();
  } catch (const Error& e) {
    EXPECT_TRUE(Contains(e.what(), "injected map failure")) << e.what();
    EXPECT_TRUE(Contains(e.what(), "rolled back")) << e.what();
  }
  EXPECT_NO_THROW(pool.check_invariants());

  memory.disarm();
  void* ptr = pool.allocate(kBlock);  // the pages left mapped serve it
  ASSERT_NE(ptr, nullptr);
  pool.free(ptr);
  pool.trim();
  EXPECT_EQ(real.mapped_bytes(), 0u);
  EXPECT_EQ(real.physical_bytes(), 0u);
  EXPECT_NO_THROW(pool.check_invariants());
}

// ---- F4: requests beyond any memory ----------------------------------------------------

TEST(VirtualMemoryPoolLimits, F4TerabyteRequestWithoutACapFailsFastWithOutOfMemory) {
  HostVirtualMemory memory;
  ASSERT_GT(memory.physical_ceiling(), 0u) << "RAM + swap";
  ASSERT_LT(memory.physical_ceiling(), std::size_t{1} << 40) << "a machine with a TiB";
  VirtualMemoryPool pool(memory);
  void* before = pool.allocate(kMiB);
  const auto start = std::chrono::steady_clock::now();
  try {
    (void)pool.allocate(std::size_t{1} << 40);
    ADD_FAILURE() << "1 TiB cannot be had";
  } catch (const OutOfMemory& e) {
    EXPECT_TRUE(Contains(e.what(), "can ever exist")) << e.what();
  }
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  EXPECT_LT(took.count(), 2.0) << "16 M chunks must not be created one by one";
  EXPECT_EQ(pool.vm_stats().creates, kMiB / kPage) << "no chunk created for the request";
  EXPECT_EQ(memory.physical_bytes(), kMiB);
  EXPECT_NO_THROW(pool.check_invariants());
  void* after = pool.allocate(kMiB);  // still usable
  pool.free(after);
  pool.free(before);
}

TEST(VirtualMemoryPoolLimits, F4RequestAboveTheCapFailsWithoutCreatingAChunk) {
  HostVirtualMemory memory;
  VirtualMemoryPool pool(memory, {.max_physical_bytes = 64 * kMiB});
  EXPECT_THROW((void)pool.allocate(65 * kMiB), OutOfMemory);
  EXPECT_EQ(pool.vm_stats().creates, 0u);
  EXPECT_EQ(pool.vm_stats().ooms, 1u);
  void* fits = pool.allocate(64 * kMiB);  // the whole cap is still fine
  ASSERT_NE(fits, nullptr);
  pool.free(fits);
}

// The refusal counts a block's unmapped pages exactly, both the pages its range's page
// table knows (mapped or not) and those past it, which it counts without visiting them.
TEST(VirtualMemoryPoolLimits, F4RefusalCountsMappedAndNeverMappedPages) {
  HostVirtualMemory memory;
  VirtualMemoryPool pool(memory, {.max_physical_bytes = 4 * kMiB, .range_size = 64 * kMiB});
  void* warm = pool.allocate(2 * kMiB);  // 32 pages mapped at the start of the range
  pool.free(warm);
  try {  // pages 0..959: 32 mapped, 928 never mapped
    (void)pool.allocate(60 * kMiB);
    ADD_FAILURE() << "60 MiB under a 4 MiB cap";
  } catch (const OutOfMemory& e) {
    EXPECT_TRUE(Contains(e.what(), "928 more pages of 65536 B")) << e.what();
  }
  void* kept = pool.allocate(2 * kMiB);
  try {  // pages 32..991, all past the page table
    (void)pool.allocate(60 * kMiB);
    ADD_FAILURE() << "60 MiB under a 4 MiB cap";
  } catch (const OutOfMemory& e) {
    EXPECT_TRUE(Contains(e.what(), "960 more pages of 65536 B")) << e.what();
  }
  EXPECT_EQ(pool.vm_stats().creates, 2 * kMiB / kPage) << "no chunk created for the requests";
  EXPECT_NO_THROW(pool.check_invariants());
  pool.free(kept);
}

// The cap may change while the pool holds memory (PyTorch's memory fraction): lowered
// below what is held, held pages still serve and no chunk is created; raised, the pool grows.
TEST(VirtualMemoryPoolLimits, TheCapChangesWhileThePoolHoldsMemory) {
  HostVirtualMemory memory;
  VirtualMemoryPool pool(memory, {.max_physical_bytes = 64 * kMiB});
  void* held = pool.allocate(16 * kMiB);
  void* freed = pool.allocate(8 * kMiB);
  pool.free(freed);  // its pages stay mapped: 24 MiB held
  pool.set_capacity(16 * kMiB);
  EXPECT_EQ(pool.capacity(), 16 * kMiB);
  const std::uint64_t creates = pool.vm_stats().creates;
  void* reused = pool.allocate(8 * kMiB);  // the held pages, no new chunk
  EXPECT_EQ(pool.vm_stats().creates, creates);
  pool.free(reused);
  try {
    (void)pool.allocate(12 * kMiB);
    ADD_FAILURE() << "12 MiB more under a cap below what is held";
  } catch (const OutOfMemory& e) {
    EXPECT_TRUE(Contains(e.what(), "the physical cap of 16777216 B")) << e.what();
  }
  EXPECT_EQ(pool.vm_stats().creates, creates) << "the refusal created nothing";
  EXPECT_NO_THROW(pool.check_invariants());
  pool.set_capacity(0);  // no cap of its own
  void* large = pool.allocate(128 * kMiB);
  ASSERT_NE(large, nullptr);
  pool.free(large);
  pool.free(held);
  EXPECT_NO_THROW(pool.check_invariants());
}

TEST(VirtualMemoryPoolLimits, F4HostCeilingIsTheLimitOrTheMachine) {
  HostVirtualMemory unlimited;
  EXPECT_EQ(unlimited.physical_capacity(), 0u) << "no fixed limit";
  EXPECT_GT(unlimited.physical_ceiling(), 0u);
  HostVirtualMemory limited({.physical_limit = 256 * kMiB});
  EXPECT_EQ(limited.physical_capacity(), 256 * kMiB);
  EXPECT_EQ(limited.physical_ceiling(), 256 * kMiB);
}

}  // namespace
}  // namespace sdalloc
