// CachingPool's error paths: out of memory (the cache given back and the request retried,
// or a clear error with the figures and a pool that still works), alignments, double and
// interior frees, a wrong size, bad options and an initial reservation beyond capacity.
// Each failure leaves the pool consistent (check_invariants) and its counters as they were.

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "policies/caching_pool_on_host.hpp"
#include "sdalloc/core/errors.hpp"
#include "sdalloc/policies/caching_pool.hpp"
#include "sdalloc/resources/host_resource.hpp"
#include "sdalloc/resources/limit_resource.hpp"
#include "sdalloc/resources/stats_resource.hpp"

namespace sdalloc {
namespace {

using test::KiB;
using test::MiB;

class CachingPoolErrors : public test::CachingPoolOnHost {};

TEST_F(CachingPoolErrors, OutOfMemoryReleasesTheCacheAndRetries) {
  LimitResource card(upstream_, 16 * MiB);
  CachingPoolOptions options = CachingPoolOptions{};
  options.release_cached_before_growth = false;
  CachingPool pool(card, options);
  void* a = pool.allocate(2 * MiB);
  void* b = pool.allocate(10 * MiB);
  pool.free(b);                       // 10 MiB cached, 12 MiB reserved
  void* c = pool.allocate(12 * MiB);  // needs the cache back
  EXPECT_EQ(pool.stats().oom_retries, 1u);
  EXPECT_EQ(pool.stats().ooms, 0u);
  pool.free(a);
  pool.free(c);
  pool.check_invariants();
}

TEST_F(CachingPoolErrors, OutOfMemoryStatesTheFiguresAndLeavesThePoolWorking) {
  LimitResource card(upstream_, 16 * MiB);
  CachingPool pool(card, CachingPoolOptions{});
  void* a = pool.allocate(10 * MiB);
  const PoolStats before = pool.stats();
  try {
    (void)pool.allocate(8 * MiB);
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& e) {
    EXPECT_EQ(e.info.requested, 8 * MiB);
    EXPECT_EQ(e.info.live, 10 * MiB);
    EXPECT_EQ(e.info.reserved, 10 * MiB);
    EXPECT_EQ(e.info.capacity, 16 * MiB);
    const std::string what = e.what();
    for (const char* word : {"live", "reserved", "largest free", "capacity"}) {
      EXPECT_NE(what.find(word), std::string::npos) << word << " missing from: " << what;
    }
  }
  const PoolStats after = pool.stats();
  EXPECT_EQ(after.live_bytes, before.live_bytes);
  EXPECT_EQ(after.allocations, before.allocations);
  EXPECT_EQ(after.ooms, 1u);
  pool.check_invariants();
  void* b = pool.allocate(4 * MiB);
  pool.free(b);
  pool.free(a);
}

TEST_F(CachingPoolErrors, HonoursLargeAlignments) {
  CachingPool pool(upstream_, CachingPoolOptions{});
  for (std::size_t alignment : {std::size_t{1024}, 4 * KiB, 64 * KiB, 1 * MiB, 4 * MiB}) {
    void* p = pool.allocate(1000, alignment, kDefaultStream);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % alignment, 0u) << alignment;
    pool.free(p);
  }
  pool.check_invariants();
}

TEST_F(CachingPoolErrors, RejectsAlignmentThatIsNotAPowerOfTwo) {
  CachingPool pool(upstream_, CachingPoolOptions{});
  EXPECT_THROW((void)pool.allocate(64, 3, kDefaultStream), InvalidArgument);
  EXPECT_THROW((void)pool.allocate(64, 2 * CachingPool::kMaxAlignment, kDefaultStream),
               InvalidArgument);
  EXPECT_EQ(pool.stats().allocations, 0u);
}

TEST_F(CachingPoolErrors, DoubleFreeIsRejectedAndNamed) {
  CachingPool pool(upstream_, CachingPoolOptions{});
  void* a = pool.allocate(4096);
  void* keep = pool.allocate(4096);
  pool.free(a);
  try {
    pool.free(a);
    FAIL() << "expected InvalidPointer";
  } catch (const InvalidPointer& e) {
    EXPECT_NE(std::string(e.what()).find("double free"), std::string::npos) << e.what();
    EXPECT_EQ(e.pointer, a);
  }
  pool.check_invariants();
  pool.free(keep);
}

TEST_F(CachingPoolErrors, InteriorPointerIsRejectedAndNamed) {
  CachingPool pool(upstream_, CachingPoolOptions{});
  void* a = pool.allocate(4096);
  try {
    pool.free(static_cast<char*>(a) + 512);
    FAIL() << "expected InvalidPointer";
  } catch (const InvalidPointer& e) {
    EXPECT_NE(std::string(e.what()).find("interior"), std::string::npos) << e.what();
  }
  EXPECT_EQ(pool.stats().live_allocations, 1u);
  pool.free(a);
}

TEST_F(CachingPoolErrors, DeallocateWithWrongSizeIsRejected) {
  CachingPool pool(upstream_, CachingPoolOptions{});
  void* a = pool.allocate(1000);
  EXPECT_THROW(pool.deallocate(a, 999), InvalidArgument);
  EXPECT_EQ(pool.allocation_size(a), 1000u);
  pool.deallocate(a, 1000);
}

TEST_F(CachingPoolErrors, BadOptionsAreRejected) {
  CachingPoolOptions bad;
  bad.segment_granularity = 3000;
  EXPECT_THROW(CachingPool(upstream_, bad), InvalidArgument);
  CachingPoolOptions bad_min;
  bad_min.min_segment_size = 3 * MiB;
  EXPECT_THROW(CachingPool(upstream_, bad_min), InvalidArgument);
  CachingPoolOptions bad_reservation;
  bad_reservation.initial_reservation = 1 * MiB;
  EXPECT_THROW(CachingPool(upstream_, bad_reservation), InvalidArgument);
}

TEST_F(CachingPoolErrors, InitialReservationBeyondCapacityFailsConstruction) {
  LimitResource card(upstream_, 8 * MiB);
  CachingPoolOptions options = CachingPoolOptions{};
  options.initial_reservation = 16 * MiB;
  EXPECT_THROW(CachingPool(card, options), OutOfMemory);
  EXPECT_EQ(card.used(), 0u);
}

}  // namespace
}  // namespace sdalloc
