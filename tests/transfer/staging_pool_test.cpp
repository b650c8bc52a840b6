// staging_pool_test.cpp - the pinned staging pool: exact sizes on the UNet trace, the
// budget (fail, wait, timeout, never over-allocated), reuse, and the freed-block books.
#include "sdalloc/transfer/staging_pool.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/resources/host_resource.hpp"
#include "sdalloc/resources/stats_resource.hpp"
#include "sdalloc/trace/event_trace.hpp"
#include "support/test_support.hpp"

namespace sdalloc {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

std::size_t next_power_of_two(std::size_t v) {
  std::size_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

TEST(StagingPool, HoldsAtMostFivePercentOverRequestedOnTheUnetTraceSizes) {
  const EventTrace trace = read_event_trace(SDALLOC_DATA_DIR "/traces/sd15_unet_b2_64x64_cpu.csv");
  std::vector<std::size_t> sizes;
  std::size_t requested = 0;
  std::size_t power_of_two = 0;
  for (const TraceEvent& e : trace.events) {
    if (e.op != TraceEvent::Op::kAlloc) continue;
    sizes.push_back(e.size);
    requested += e.size;
    power_of_two += next_power_of_two(e.size);
  }
  ASSERT_GT(sizes.size(), 1000u);
  HostResource host;
  StatsResource upstream(host);
  StagingPool pool(upstream, StagingPoolOptions{requested + requested / 10});
  std::vector<void*> blocks;
  for (const std::size_t size : sizes) blocks.push_back(pool.allocate(size));
  const StagingPoolStats stats = pool.stats();
  EXPECT_EQ(stats.requested_bytes, requested);
  const double held = static_cast<double>(stats.held_bytes) / static_cast<double>(requested);
  const double pow2 = static_cast<double>(power_of_two) / static_cast<double>(requested);
  std::printf("staging pool on %zu UNet sizes: holds %.5fx requested; power-of-two: %.3fx\n",
              sizes.size(), held, pow2);
  EXPECT_LE(held, 1.05);
  EXPECT_EQ(upstream.stats().current_bytes, stats.held_bytes);  // what the upstream really gave
  EXPECT_GT(pow2, held);
  for (void* p : blocks) pool.deallocate(p);
}

TEST(StagingPool, FreedBlockOfTheSameSizeIsReused) {
  HostResource host;
  StatsResource upstream(host);
  StagingPool pool(upstream, StagingPoolOptions{8 * kMiB});
  void* a = pool.allocate(3 * kMiB + 5);
  pool.deallocate(a);
  void* b = pool.allocate(3 * kMiB + 5);
  EXPECT_EQ(a, b);
  EXPECT_EQ(pool.stats().upstream_allocations, 1u);
  EXPECT_EQ(pool.stats().cache_hits, 1u);
  pool.deallocate(b);
}

TEST(StagingPool, RequestBeyondTheBudgetFailsWithoutOverAllocating) {
  HostResource host;
  StatsResource upstream(host);
  StagingPool pool(upstream, StagingPoolOptions{4 * kMiB, StagingPoolOptions::WhenFull::kFail});
  void* a = pool.allocate(3 * kMiB);
  try {
    (void)pool.allocate(2 * kMiB);
    FAIL() << "allocate past the budget succeeded";
  } catch (const OutOfMemory& e) {
    EXPECT_TRUE(test::Contains(e.what(), "budget is reached"));
    EXPECT_EQ(e.info.capacity, 4 * kMiB);
  }
  EXPECT_LE(upstream.stats().peak_bytes, 4 * kMiB);
  EXPECT_THROW((void)pool.allocate(5 * kMiB), OutOfMemory);  // larger than the budget
  EXPECT_THROW((void)pool.allocate(~std::size_t{0}), OutOfMemory);
  pool.deallocate(a);
  void* b = pool.allocate(2 * kMiB);  // usable after: the cached 3 MiB block is released
  EXPECT_LE(pool.stats().held_bytes, 4 * kMiB);
  pool.deallocate(b);
}

TEST(StagingPool, RequestBeyondTheBudgetWaitsForAFree) {
  HostResource host;
  StagingPool pool(host, StagingPoolOptions{4 * kMiB, StagingPoolOptions::WhenFull::kWait,
                                            std::chrono::milliseconds(10000)});
  void* a = pool.allocate(3 * kMiB);
  std::thread freer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    pool.deallocate(a);
  });
  const auto start = std::chrono::steady_clock::now();
  void* b = pool.allocate(2 * kMiB);
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(40));
  freer.join();
  EXPECT_EQ(pool.stats().waits, 1u);
  EXPECT_LE(pool.stats().peak_held_bytes, 4 * kMiB);
  pool.deallocate(b);
}

TEST(StagingPool, WaitEndsInOutOfMemoryAfterTheTimeout) {
  HostResource host;
  StagingPool pool(host, StagingPoolOptions{4 * kMiB, StagingPoolOptions::WhenFull::kWait,
                                            std::chrono::milliseconds(30)});
  void* a = pool.allocate(3 * kMiB);
  try {
    (void)pool.allocate(2 * kMiB);
    FAIL() << "allocate past the budget succeeded";
  } catch (const OutOfMemory& e) {
    EXPECT_TRUE(test::Contains(e.what(), "wait_timeout"));
  }
  pool.deallocate(a);
}

TEST(StagingPool, BooksTellLiveFreedAndForeignPointersApart) {
  HostResource host;
  StagingPool pool(host, StagingPoolOptions{4 * kMiB});
  auto* a = static_cast<char*>(pool.allocate(kMiB));
  int outside = 0;
  EXPECT_EQ(pool.state_of(a + 100), StagingPool::BlockState::kLive);
  EXPECT_EQ(pool.state_of(&outside), StagingPool::BlockState::kNone);
  pool.deallocate(a);
  EXPECT_EQ(pool.state_of(a + 100), StagingPool::BlockState::kFreed);
  EXPECT_THROW(pool.deallocate(a), InvalidPointer);         // double free
  EXPECT_THROW(pool.deallocate(&outside), InvalidPointer);  // never handed out
  EXPECT_EQ(pool.trim(), kMiB);
  EXPECT_EQ(pool.state_of(a + 100), StagingPool::BlockState::kNone);
  EXPECT_THROW(StagingPool(host, StagingPoolOptions{0}), InvalidArgument);
}

}  // namespace
}  // namespace sdalloc
