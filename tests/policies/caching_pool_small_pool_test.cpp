// CachingPool below small_pool_limit: segments, and the consolidated arena, round to
// small_granularity (128 KiB) instead of the 2 MiB segment granularity, and min_segment_size
// does not apply; from the limit on, the usual rounding holds.
#include <gtest/gtest.h>

#include <cstddef>
#include <string>

#include "policies/caching_pool_on_host.hpp"
#include "sdalloc/core/errors.hpp"
#include "sdalloc/policies/caching_pool.hpp"
#include "sdalloc/resources/host_resource.hpp"
#include "sdalloc/resources/stats_resource.hpp"

namespace sdalloc {
namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

class SmallPoolTest : public ::testing::Test {
 protected:
  HostResource host_;
  StatsResource upstream_{host_};
};

TEST_F(SmallPoolTest, ASmallPoolTakesSegmentsOfTheSmallGranularity) {
  // The 128 KiB segment keeps its free end (the 300 KiB would take it:
  // caching_pool_free_ends_test.cpp).
  CachingPool pool(upstream_, CachingPoolOptions{.cut_free_ends = false});
  void* a = pool.allocate(100 * KiB);
  EXPECT_EQ(pool.stats().reserved_bytes, 128 * KiB) << "not a 2 MiB min_segment_size";
  void* b = pool.allocate(300 * KiB);
  EXPECT_EQ(pool.stats().reserved_bytes, 128 * KiB + 384 * KiB);
  EXPECT_EQ(pool.stats().segments, 2u);
  pool.free(a);
  pool.free(b);
  pool.check_invariants();
}

TEST_F(SmallPoolTest, FromTheLimitOnSegmentsRoundToTheGranularity) {
  // The 128 KiB segment keeps its free end (the 70 MiB would take it:
  // caching_pool_free_ends_test.cpp).
  CachingPool pool(upstream_, CachingPoolOptions{.cut_free_ends = false});
  void* small = pool.allocate(100 * KiB);
  // 70 MiB takes the pool past small_pool_limit (64 MiB): 2 MiB rounding from here on.
  void* big = pool.allocate(70 * MiB + 1);
  EXPECT_EQ(pool.stats().reserved_bytes, 128 * KiB + 72 * MiB);
  void* next = pool.allocate(100 * KiB);  // no room left in the 128 KiB segment
  EXPECT_EQ(pool.stats().reserved_bytes, 128 * KiB + 72 * MiB + 2 * MiB)
      << "a min_segment_size segment again";
  pool.free(small);
  pool.free(big);
  pool.free(next);
  pool.check_invariants();
}

TEST_F(SmallPoolTest, ZeroLimitTurnsTheRuleOff) {
  CachingPoolOptions options;
  options.small_pool_limit = 0;
  CachingPool pool(upstream_, options);
  void* a = pool.allocate(100 * KiB);
  EXPECT_EQ(pool.stats().reserved_bytes, 2 * MiB);
  pool.free(a);
}

TEST_F(SmallPoolTest, TheConsolidatedArenaOfASmallPoolRoundsToTheSmallGranularity) {
  CachingPool pool(upstream_);
  test::churn_to_an_empty_stream(pool, MiB);
  void* d = pool.allocate(64 * KiB);  // consolidates first
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.consolidations, 1u);
  EXPECT_EQ(s.segments, 1u);
  EXPECT_EQ(s.reserved_bytes % (128 * KiB), 0u);
  EXPECT_LT(s.reserved_bytes, 4 * MiB) << "peak 2.5 MiB plus 1/16, in 128 KiB steps";
  EXPECT_GE(s.reserved_bytes, 2560 * KiB);
  pool.free(d);
  pool.check_invariants();
}

TEST_F(SmallPoolTest, ASmallGranularityThatIsNoPowerOfTwoIsRefused) {
  CachingPoolOptions options;
  options.small_granularity = 100 * KiB;
  try {
    CachingPool pool(upstream_, options);
    FAIL() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("small_granularity"), std::string::npos) << e.what();
  }
  options.small_pool_limit = 0;  // off: the granularity is not used
  EXPECT_NO_THROW(CachingPool(upstream_, options));
}

}  // namespace
}  // namespace sdalloc
