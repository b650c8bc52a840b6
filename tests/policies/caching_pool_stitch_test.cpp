// CachingPool's stitching: a request that an arena lacks room for, where growing the arena
// would take the pool more than 1/16 above the most it ever had allocated, takes a new
// segment made of the free pages cut out of the arena between its live blocks
// (include/sdalloc/policies/caching_pool.hpp, "Free ends"; docs/caching_pool.md,
// "Stitching an arena's free pages").
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <functional>

#include "policies/caching_pool_on_host.hpp"
#include "support/fault_injection.hpp"
#include "support/mapped_pages.hpp"

namespace sdalloc {
namespace {

using test::bytes_of;
using test::large_pool_options;
using test::MiB;

// A 20 MiB arena (two segments churned, then consolidated when the stream emptied), tiled
// as [6 MiB][kept 1 MiB][6 MiB][kept 1 MiB][6 MiB] with the 6 MiB blocks freed and written
// with 0x41: 18 MiB free in three pieces, the largest 6 MiB, the arena's free tail 6 MiB.
// Then a 10 MiB request: the arena would grow by 4 MiB, to 24 MiB, 1.2 x the 20 MiB the
// pool ever had allocated. `before_request` runs just before it (a test arms a fault there).
struct FragmentedArena {
  FragmentedArena(MemoryResource& upstream, CachingPoolOptions options,
                  const std::function<void()>& before_request = {})
      : pool(upstream, options) {
    test::churn_to_an_empty_stream(pool, 8 * MiB);  // one 20 MiB arena next
    void* pieces[3] = {};
    pieces[0] = pool.allocate(6 * MiB);  // consolidates first: one 20 MiB arena
    kept[0] = pool.allocate(MiB);
    pieces[1] = pool.allocate(6 * MiB);
    kept[1] = pool.allocate(MiB);
    pieces[2] = pool.allocate(6 * MiB);
    arena = pool.stats().reserved_bytes;
    for (void* k : kept) std::memset(k, 0x6b, MiB);
    for (void* p : pieces) {
      std::memset(p, 0x41, 6 * MiB);
      pool.free(p);
    }
    grown_from = pool.stats();
    if (before_request) before_request();
    big = pool.allocate(10 * MiB);
    std::memset(big, 0x5a, 10 * MiB);
  }
  bool kept_intact() const {
    for (void* k : kept) {
      for (std::size_t i = 0; i < MiB; i += 4096) {
        if (bytes_of(k)[i] != 0x6b || bytes_of(k)[i + 4095] != 0x6b) return false;
      }
    }
    return true;
  }
  CachingPool pool;
  void* kept[2] = {};
  void* big = nullptr;
  std::size_t arena = 0;
  PoolStats grown_from;
};

class CachingPoolStitch : public test::CachingPoolOnHost {};

TEST_F(CachingPoolStitch, TheArenasFreePagesServeTheRequestInsteadOfGrowth) {
  FragmentedArena run(upstream_, large_pool_options());
  ASSERT_EQ(run.grown_from.consolidations, 1u);
  ASSERT_EQ(run.arena, 20 * MiB);
  ASSERT_EQ(run.grown_from.segments, 1u);
  const PoolStats s = run.pool.stats();
  EXPECT_EQ(s.arena_growths, 0u);
  EXPECT_EQ(s.stitches, 1u);
  EXPECT_GT(s.segment_splits, run.grown_from.segment_splits) << "the arena was cut";
  EXPECT_LE(upstream_.stats().peak_bytes, 20 * MiB) << "never more than the arena held";
  EXPECT_LE(s.peak_reserved_bytes, 20 * MiB);
  EXPECT_TRUE(run.kept_intact()) << "the live blocks stay where they were";
  EXPECT_EQ(bytes_of(run.big)[10 * MiB - 1], 0x5a);
  run.pool.check_invariants();

  // The pieces still work: everything is freed, the same work runs again, all goes back.
  run.pool.free(run.big);
  for (void* k : run.kept) run.pool.free(k);
  run.pool.check_invariants();
  void* again = run.pool.allocate(10 * MiB);
  void* small = run.pool.allocate(MiB);
  std::memset(again, 1, 10 * MiB);
  run.pool.free(again);
  run.pool.free(small);
  run.pool.check_invariants();
  run.pool.trim();
  EXPECT_EQ(upstream_.stats().current_bytes, 0u) << "every cut range went back";
  EXPECT_EQ(upstream_.stats().current_count, 0u);
}

TEST_F(CachingPoolStitch, TurnedOffOrInASmallPoolTheArenaGrows) {
  CachingPoolOptions off = large_pool_options();
  off.cut_free_ends = false;
  FragmentedArena uncut(upstream_, off);
  EXPECT_EQ(uncut.pool.stats().arena_growths, 1u);
  EXPECT_EQ(uncut.pool.stats().stitches, 0u);
  EXPECT_EQ(uncut.pool.stats().reserved_bytes, 24 * MiB);
  EXPECT_TRUE(uncut.kept_intact());
  uncut.pool.check_invariants();

  CachingPoolOptions small;  // the default small_pool_limit (64 MiB): a small pool
  FragmentedArena in_small(upstream_, small);
  EXPECT_EQ(in_small.pool.stats().arena_growths, 1u);
  EXPECT_EQ(in_small.pool.stats().stitches, 0u);
  EXPECT_TRUE(in_small.kept_intact());
  in_small.pool.check_invariants();
}

// The stitched segment is refused (its coalesce fails after the arena was cut): the cut
// pages went back with the coalesce, as it promises, the pool retries once with fresh
// memory, and the live blocks and the pool's books are intact; nothing is held twice.
TEST_F(CachingPoolStitch, ARefusedStitchedSegmentLeavesThePoolConsistent) {
  test::FaultPlan plan;
  test::FaultInjectingResource faulty(upstream_, plan);
  FragmentedArena run(faulty, large_pool_options(), [&] {
    plan.count_only({test::ResourceCall::kCoalesce, test::ResourceCall::kAllocate});
    plan.fail_call(0);  // the coalesce of the cut runs into the stitched segment
  });
  EXPECT_EQ(plan.failures(), 1u);
  const PoolStats s = run.pool.stats();
  EXPECT_EQ(s.stitches, 1u) << "the arena was cut before the refusal";
  EXPECT_EQ(s.arena_growths, 0u);
  EXPECT_EQ(s.ooms, 0u) << "the retry served it";
  EXPECT_EQ(upstream_.stats().current_bytes, s.reserved_bytes) << "no range held twice or lost";
  EXPECT_TRUE(run.kept_intact());
  std::memset(run.big, 0x5a, 10 * MiB);
  run.pool.check_invariants();
  run.pool.free(run.big);
  for (void* k : run.kept) run.pool.free(k);
  run.pool.trim();
  EXPECT_EQ(upstream_.stats().current_bytes, 0u);
}

// Growth within 1/16 of the most the pool ever allocated keeps the arena whole, though
// its free pages would do: a growth made once serves every later pass without a system
// call, where a stitch is made again in each.
TEST_F(CachingPoolStitch, ASmallGrowthGrowsTheArena) {
  CachingPool pool(upstream_, large_pool_options());
  test::churn_to_an_empty_stream(pool, 8 * MiB);  // one 20 MiB arena next
  void* front = pool.allocate(2 * MiB);           // consolidates first: the 20 MiB arena
  void* kept = pool.allocate(MiB / 2);
  void* rest = pool.allocate(35 * MiB / 2);
  ASSERT_EQ(pool.stats().reserved_bytes, 20 * MiB);
  pool.free(front);
  pool.free(rest);
  const std::uint64_t splits = pool.stats().segment_splits;
  // 19.5 MiB free, 17.5 of it at the end: the arena lacks 0.5 MiB, 1/40 of the 20 MiB peak.
  void* big = pool.allocate(18 * MiB);
  EXPECT_EQ(pool.stats().arena_growths, 1u);
  EXPECT_EQ(pool.stats().stitches, 0u);
  EXPECT_EQ(pool.stats().segment_splits, splits);
  EXPECT_EQ(pool.stats().reserved_bytes, 41 * MiB / 2);
  pool.free(big);
  pool.free(kept);
  pool.check_invariants();
}

}  // namespace
}  // namespace sdalloc
