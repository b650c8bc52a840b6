// caching_pool_consolidation_test.cpp - the segment cache's one consolidation rule
// (caching_pool.hpp, "Consolidation"): a stream that released segments only to take new ones
// runs its next cycle in one arena, once its work has gone through a whole cycle (it is
// empty, or back at its low after rising), and a repeated loop then makes no segment call.
#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <cstdint>

#include "sdalloc/policies/caching_pool.hpp"
#include "sdalloc/resources/host_resource.hpp"
#include "sdalloc/resources/stats_resource.hpp"

namespace sdalloc {
namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

// One Run() of a torch-exported ResNet-50 in ONNX Runtime 1.29 with sdalloc's allocator
// registered (the adapter's Alloc and Free calls, recorded from sdalloc_ort_bench): an
// allocation takes the next slot, a free names the slot; sizes in bytes. Peak live 4.98 MiB.
struct Event {
  bool alloc;
  int slot;
  std::size_t bytes;
};
constexpr std::array<Event, 40> kOrtResNet50Run = {{
    {true, 0, 3211264},  {true, 1, 802816},   {false, 0, 3211264}, {true, 2, 802816},
    {true, 3, 802816},   {false, 2, 802816},  {true, 4, 3211264},  {false, 1, 802816},
    {false, 3, 802816},  {true, 5, 1605632},  {true, 6, 401408},   {false, 5, 1605632},
    {true, 7, 1605632},  {false, 4, 3211264}, {true, 8, 401408},   {false, 6, 401408},
    {false, 8, 401408},  {true, 9, 802816},   {true, 10, 200704},  {false, 9, 802816},
    {true, 11, 802816},  {false, 7, 1605632}, {true, 12, 200704},  {false, 10, 200704},
    {false, 12, 200704}, {true, 13, 401408},  {true, 14, 100352},  {false, 13, 401408},
    {true, 15, 401408},  {false, 11, 802816}, {true, 16, 100352},  {false, 16, 100352},
    {false, 14, 100352}, {true, 17, 8192},    {false, 15, 401408}, {true, 18, 8192},
    {false, 17, 8192},   {true, 19, 4000},    {false, 18, 8192},   {false, 19, 4000},
}};

// Replays one run; answers the pool's peak reserved bytes during it (measured through
// reset_peak, which must not change what the pool does: see the last test).
std::size_t run_once(CachingPool& pool, bool reset_peak = true) {
  std::array<void*, 20> slots{};
  if (reset_peak) pool.reset_peak();
  for (const Event& e : kOrtResNet50Run) {
    if (e.alloc) {
      slots[e.slot] = pool.allocate(e.bytes);
    } else {
      pool.deallocate(slots[e.slot], e.bytes);
    }
  }
  return pool.stats().peak_reserved_bytes;
}

// The runs settle: the arena is made at the first allocation after a cycle that churned, and
// from then on the same run takes and returns nothing. Returns the settled footprint.
std::size_t expect_settles_by_run(CachingPool& pool, StatsResource& upstream, int settled_run) {
  for (int run = 0; run < settled_run; ++run) run_once(pool);
  const std::uint64_t taken = upstream.stats().allocations;
  const std::uint64_t returned = upstream.stats().deallocations;
  const std::size_t settled = pool.stats().reserved_bytes;
  for (int run = 0; run < 4; ++run) {
    EXPECT_EQ(run_once(pool), settled) << "run " << settled_run + run + 1;
  }
  EXPECT_EQ(upstream.stats().allocations, taken) << "later runs take no segment";
  EXPECT_EQ(upstream.stats().deallocations, returned) << "and return none";
  pool.check_invariants();
  return settled;
}

class ConsolidationTest : public ::testing::Test {
 protected:
  HostResource host_;
  StatsResource upstream_{host_};
};

// The session's run grows into its segments without releasing one (no churn): nothing to
// consolidate, and the same run takes nothing more from its second on.
TEST_F(ConsolidationTest, ARunThatNeverChurnsKeepsItsSegmentsAndSettles) {
  CachingPool pool(upstream_);
  const std::size_t first = run_once(pool);
  EXPECT_EQ(pool.stats().segment_releases, 0u);
  const std::size_t settled = expect_settles_by_run(pool, upstream_, 1);
  EXPECT_EQ(pool.stats().consolidations, 0u);
  EXPECT_EQ(settled, first);
}

TEST_F(ConsolidationTest, AStreamOverWeightsSettlesWhenItsWorkComesBackToItsLow) {
  CachingPool pool(upstream_, {.segment_granularity = 256 * KiB, .min_segment_size = 256 * KiB});
  void* weights = pool.allocate(8 * MiB);  // lives throughout: the stream never empties
  expect_settles_by_run(pool, upstream_, 3);
  pool.free(weights);
}

// A small block allocated first and live throughout (a session's first small tensor): the
// stream never empties, and its low is that block; the work above it still settles.
TEST_F(ConsolidationTest, ASmallLongLivedBlockDoesNotKeepTheWorkFromSettling) {
  CachingPool pool(upstream_, {.segment_granularity = 256 * KiB, .min_segment_size = 256 * KiB});
  void* first = pool.allocate(4000);
  expect_settles_by_run(pool, upstream_, 3);
  pool.free(first);
}

// At its low, a stream that allocates and frees a little (a step's first small tensors) has
// not gone through a cycle: only a rise by half its work above the low ends one.
TEST_F(ConsolidationTest, SmallWorkAtTheLowIsNoCycle) {
  CachingPool pool(upstream_);
  void* weights = pool.allocate(8 * MiB);
  void* a = pool.allocate(4 * MiB);
  pool.free(a);
  void* b = pool.allocate(6 * MiB);  // past the peak: a's segment is released (a churn)
  pool.free(b);                      // back at the low: weights alone
  for (int i = 0; i < 4; ++i) pool.free(pool.allocate(1 * MiB));
  EXPECT_EQ(pool.stats().consolidations, 0u);
  void* c = pool.allocate(6 * MiB);  // the work rises again, and comes back
  pool.free(c);
  pool.free(pool.allocate(1 * MiB));
  EXPECT_EQ(pool.stats().consolidations, 1u);
  pool.free(weights);
  pool.check_invariants();
}

TEST_F(ConsolidationTest, SegmentsThatServeTheWorkTightlyStayAsTheyAre) {
  CachingPool pool(upstream_);
  for (int run = 0; run < 4; ++run) {
    void* a = pool.allocate(1 * MiB);
    void* b = pool.allocate(1 * MiB);
    void* c = pool.allocate(1 * MiB);  // a second segment, none ever released to grow
    pool.free(b);
    pool.free(a);
    pool.free(c);
  }
  EXPECT_EQ(pool.stats().consolidations, 0u);
  EXPECT_EQ(pool.stats().segments, 2u) << "a and b share the smallest segment";
  EXPECT_EQ(pool.stats().segment_allocations, 2u);
}

// reset_peak() starts new figures; the pool's policy (release before growth, the arena's
// size, lows) goes by the highest values ever, so measuring a stretch of work (as
// torch.cuda.reset_peak_memory_stats does, between steps) changes nothing the pool does.
TEST_F(ConsolidationTest, ResetPeakChangesNothingThePoolDoes) {
  HostResource other_host;
  StatsResource other_upstream{other_host};
  const CachingPoolOptions options{.segment_granularity = 256 * KiB, .min_segment_size = 256 * KiB};
  CachingPool measured(upstream_, options);
  CachingPool unmeasured(other_upstream, options);
  void* weights = measured.allocate(8 * MiB);
  void* other_weights = unmeasured.allocate(8 * MiB);
  for (int run = 0; run < 6; ++run) {
    run_once(measured, /*reset_peak=*/true);
    run_once(unmeasured, /*reset_peak=*/false);
    EXPECT_EQ(upstream_.stats().allocations, other_upstream.stats().allocations) << run;
    EXPECT_EQ(upstream_.stats().deallocations, other_upstream.stats().deallocations) << run;
    EXPECT_EQ(measured.stats().reserved_bytes, unmeasured.stats().reserved_bytes) << run;
    EXPECT_EQ(measured.stats().consolidations, unmeasured.stats().consolidations) << run;
  }
  measured.free(weights);
  unmeasured.free(other_weights);
}

}  // namespace
}  // namespace sdalloc
