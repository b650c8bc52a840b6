// CachingPool consolidates a stream whose segments serve its work badly even when it never
// releases one: an ONNX Runtime session's first Run() takes segments whose free parts the
// later runs cannot use, and every later run fits in them, so nothing churns again. The
// stream is consolidated once, into an arena of its peak allocated bytes plus 1/16, when its
// work ends (the stream empties, or comes back to the floor of long-lived blocks after one
// more cycle of the work above it).
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

// The arena a small pool makes for this work: peak allocated + 1/16, in 128 KiB steps.
std::size_t small_pool_arena(std::size_t peak_allocated) {
  return (peak_allocated + peak_allocated / 16 + 128 * KiB - 1) / (128 * KiB) * (128 * KiB);
}

// The rules below act where free ends are not cut (a GPU's memory, whose pages are as
// coarse as the segments): on host memory a small pool cuts them (caching_pool.hpp, "Free
// ends"), which makes the first run tight and leaves these rules little to do, so the
// pools of these tests turn the cut off. The session with the cut: the last tests.
constexpr CachingPoolOptions kUncut{.cut_free_ends = false};

class FragmentationTest : public ::testing::Test {
 protected:
  HostResource host_;
  StatsResource upstream_{host_};
};

TEST_F(FragmentationTest, AStreamWhoseSegmentsServeItBadlyIsConsolidatedOnce) {
  CachingPool pool(upstream_, kUncut);
  const std::size_t first = run_once(pool);
  const std::size_t peak_allocated = pool.stats().peak_allocated_bytes;
  EXPECT_EQ(pool.stats().segment_releases, 0u) << "the first run never releases a segment";
  EXPECT_GT(first, peak_allocated + peak_allocated / 4) << "its segments, badly used";
  EXPECT_EQ(pool.stats().consolidations, 0u) << "not at the free that empties the stream";
  // The bound: the arena, never grown.
  const std::size_t arena = small_pool_arena(peak_allocated);
  run_once(pool);
  EXPECT_EQ(pool.stats().consolidations, 1u) << "at the first allocation of the next run";
  EXPECT_EQ(pool.stats().segments, 1u);
  EXPECT_EQ(pool.stats().reserved_bytes, arena);
  const std::uint64_t calls = upstream_.stats().allocations;
  for (int run = 0; run < 4; ++run) {
    EXPECT_EQ(run_once(pool), arena) << "run " << run + 3;
  }
  EXPECT_EQ(upstream_.stats().allocations, calls) << "later runs make no system call";
  EXPECT_EQ(pool.stats().consolidations, 1u);
  pool.check_invariants();
}

TEST_F(FragmentationTest, AStreamWithWeightsIsConsolidatedAtTheirFloor) {
  CachingPool pool(upstream_, kUncut);
  void* weights = pool.allocate(8 * MiB);  // lives throughout: the stream never empties
  run_once(pool);
  const std::size_t work_peak = pool.stats().peak_allocated_bytes - 8 * MiB;
  EXPECT_EQ(pool.stats().consolidations, 0u) << "the floor is armed, not yet seen again";
  run_once(pool);  // rises to its peak and comes back to the floor: consolidation is due
  run_once(pool);
  EXPECT_EQ(pool.stats().consolidations, 1u);
  const std::size_t arena = pool.stats().reserved_bytes - 8 * MiB;
  EXPECT_LE(arena, work_peak + work_peak / 16 + 128 * KiB);
  const std::uint64_t calls = upstream_.stats().allocations;
  for (int run = 0; run < 3; ++run) run_once(pool);
  EXPECT_EQ(upstream_.stats().allocations, calls);
  EXPECT_EQ(pool.stats().consolidations, 1u);
  pool.free(weights);
  pool.check_invariants();
}

// What a pool holds once the session's runs have settled in it with nothing else in the
// pool: its arena.
std::size_t settled_bytes(MemoryResource& upstream) {
  CachingPool alone(upstream, kUncut);
  for (int run = 0; run < 3; ++run) run_once(alone);
  return alone.stats().reserved_bytes;
}

// A small block allocated first and live throughout (a session's first small tensor, a
// buffer of a few KiB): the stream never empties, and its floor is far below half its peak,
// so neither rule consolidated it, and every run held 1.456 x its live peak for good. It is
// consolidated once nearly empty, and settles at the arena of the runs alone plus the small
// block's own 128 KiB segment.
TEST_F(FragmentationTest, ASmallLongLivedBlockDoesNotKeepTheSessionFragmented) {
  const std::size_t arena = settled_bytes(upstream_);
  CachingPool pool(upstream_, kUncut);
  void* first = pool.allocate(4000);
  for (int run = 0; run < 2; ++run) run_once(pool);
  EXPECT_EQ(pool.stats().consolidations, 1u);
  const std::uint64_t calls = upstream_.stats().allocations;
  for (int run = 0; run < 4; ++run) {
    EXPECT_EQ(run_once(pool), arena + 128 * KiB) << "run " << run + 3;
  }
  EXPECT_EQ(upstream_.stats().allocations, calls) << "later runs make no system call";
  EXPECT_EQ(pool.stats().consolidations, 1u);
  pool.free(first);
  pool.check_invariants();
}

// A small block allocated and freed first: its 128 KiB segment goes back when the first run
// grows, a release of under 1/16 of that growth. Counted as a churn, it sized the arena on
// the fragmented segments' peak (1.432 x live in every run); it is no churn, and the
// session settles where it does without that block.
TEST_F(FragmentationTest, ReleasingAFirstSmallSegmentIsNoChurn) {
  const std::size_t arena = settled_bytes(upstream_);
  CachingPool pool(upstream_, kUncut);
  pool.free(pool.allocate(4000));
  for (int run = 0; run < 2; ++run) run_once(pool);
  EXPECT_EQ(pool.stats().consolidations, 1u);
  for (int run = 0; run < 4; ++run) {
    EXPECT_EQ(run_once(pool), arena) << "run " << run + 3;
  }
  pool.check_invariants();
}

TEST_F(FragmentationTest, SegmentsThatServeTheWorkTightlyStayAsTheyAre) {
  CachingPool pool(upstream_, kUncut);
  for (int run = 0; run < 4; ++run) {
    void* a = pool.allocate(1 * MiB);
    void* b = pool.allocate(1 * MiB);
    void* c = pool.allocate(1 * MiB);  // three exact segments: nothing free beside them
    pool.free(b);
    pool.free(a);
    pool.free(c);
  }
  EXPECT_EQ(pool.stats().consolidations, 0u);
  EXPECT_EQ(pool.stats().segments, 3u);
  EXPECT_EQ(pool.stats().segment_allocations, 3u);
}

// Where the arena cannot grow in place (CUDA, or grow_arena off), work larger than the
// arena takes a segment beside it; making the arena again at the same size would take that
// segment again in every cycle. Once a stream has its arena, fragmentation alone does not
// consolidate it.
TEST_F(FragmentationTest, AnArenaThatOverflowsIsNotMadeAgain) {
  CachingPoolOptions options = kUncut;
  options.grow_arena = false;
  CachingPool pool(upstream_, options);
  run_once(pool);
  run_once(pool);
  ASSERT_EQ(pool.stats().consolidations, 1u);
  for (int run = 0; run < 4; ++run) {
    void* extra = pool.allocate(3 * MiB);  // beside the run's own peak: the arena overflows
    run_once(pool);
    pool.free(extra);
  }
  const std::uint64_t calls = upstream_.stats().allocations;
  const std::size_t reserved = pool.stats().reserved_bytes;
  for (int run = 0; run < 3; ++run) {
    void* extra = pool.allocate(3 * MiB);
    run_once(pool);
    pool.free(extra);
  }
  EXPECT_EQ(pool.stats().consolidations, 1u);
  EXPECT_EQ(upstream_.stats().allocations, calls) << "no segment is taken again per cycle";
  EXPECT_EQ(pool.stats().reserved_bytes, reserved);
  pool.check_invariants();
}

// reset_peak() starts new figures; the pool's policy (release before growth, the arena's
// size, floors) goes by the highest values ever, so measuring a stretch of work (as
// torch.cuda.reset_peak_memory_stats does, between steps) changes nothing the pool does.
// Before, each reset made the next growth release every free segment, and the arena was
// sized by the peaks since the reset.
TEST_F(FragmentationTest, ResetPeakChangesNothingThePoolDoes) {
  HostResource other_host;
  StatsResource other_upstream{other_host};
  CachingPool measured(upstream_, kUncut);
  CachingPool unmeasured(other_upstream, kUncut);
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
  EXPECT_EQ(measured.stats().consolidations, 1u);
  measured.free(weights);
  unmeasured.free(other_weights);
}

// The same session on host memory, free ends cut (the default): its first run is tight,
// since the free pages beside its first tensors feed the segments of the later ones (1.432
// x live in segments without the cut), and its arena, with a small pool's 1/16 headroom,
// holds every later run with no system call.
TEST_F(FragmentationTest, WithFreeEndsCutTheFirstRunIsTightAndTheArenaSettles) {
  CachingPool pool(upstream_);
  const std::size_t first = run_once(pool);
  const std::size_t peak_allocated = pool.stats().peak_allocated_bytes;
  EXPECT_GT(pool.stats().segment_splits, 0u);
  EXPECT_LE(first, peak_allocated + peak_allocated / 10) << "within 1.10 x live";
  run_once(pool);
  EXPECT_EQ(pool.stats().consolidations, 1u);
  const std::size_t arena = small_pool_arena(peak_allocated);
  EXPECT_EQ(pool.stats().reserved_bytes, arena) << "the headroom of a small pool's arena";
  const std::uint64_t calls = upstream_.stats().allocations;
  const std::uint64_t splits = pool.stats().segment_splits;
  for (int run = 0; run < 4; ++run) {
    EXPECT_EQ(run_once(pool), arena) << "run " << run + 3;
  }
  EXPECT_EQ(upstream_.stats().allocations, calls) << "later runs make no system call";
  EXPECT_EQ(pool.stats().segment_splits, splits) << "nor cut anything";
  pool.check_invariants();
}

// With a 4 KiB block allocated first and live throughout, every run churned (the cuts
// release segments, so the rule for a stream that only fragmented does not apply) and
// never consolidated: segment calls in every run. In a small pool the floor of a few
// long-lived blocks counts, once the work has come back to it twice.
TEST_F(FragmentationTest, WithFreeEndsCutAFewLongLivedBlocksStillLetTheSessionSettle) {
  CachingPool pool(upstream_);
  void* first = pool.allocate(4000);
  for (int run = 0; run < 3; ++run) run_once(pool);
  EXPECT_EQ(pool.stats().consolidations, 1u);
  const std::size_t peak_allocated = pool.stats().peak_allocated_bytes;
  const std::uint64_t calls = upstream_.stats().allocations;
  const std::size_t settled = pool.stats().reserved_bytes;
  EXPECT_LE(settled, peak_allocated + peak_allocated / 10) << "within 1.10 x live";
  for (int run = 0; run < 4; ++run) {
    EXPECT_EQ(run_once(pool), settled) << "run " << run + 4;
  }
  EXPECT_EQ(upstream_.stats().allocations, calls) << "later runs make no system call";
  EXPECT_EQ(pool.stats().consolidations, 1u);
  pool.free(first);
  pool.check_invariants();
}

}  // namespace
}  // namespace sdalloc
