// Behaviour of CachingPool's policy: reuse, splitting, merging, best fit, huge blocks,
// growth and release, streams, and what the hot path avoids. Out of memory, bad pointers,
// alignments and options: caching_pool_errors_test.cpp.
// The generic contract (alignment, random sequences, threads, error paths) is checked for
// every configuration in tests/conformance/.

#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>
#include <set>
#include <vector>

#include "policies/caching_pool_on_host.hpp"
#include "sdalloc/policies/caching_pool.hpp"
#include "sdalloc/resources/host_resource.hpp"
#include "sdalloc/resources/stats_resource.hpp"

// Counts heap allocations made by this test binary, to prove the cache-hit path makes none.
// Every form of operator new and delete is replaced, so that each pair matches (mixing a
// replaced delete with the runtime's new is an error AddressSanitizer reports).
namespace {
std::atomic<std::size_t> g_heap_allocations{0};

void* counted_allocation(std::size_t n, std::size_t alignment) noexcept {
  g_heap_allocations.fetch_add(1, std::memory_order_relaxed);
  if (n == 0) n = 1;
  if (alignment <= alignof(std::max_align_t)) return std::malloc(n);
  return std::aligned_alloc(alignment, (n + alignment - 1) / alignment * alignment);
}

void* counted_or_throw(std::size_t n, std::size_t alignment) {
  if (void* p = counted_allocation(n, alignment)) return p;
  throw std::bad_alloc();
}
}  // namespace

void* operator new(std::size_t n) { return counted_or_throw(n, 0); }
void* operator new[](std::size_t n) { return counted_or_throw(n, 0); }
void* operator new(std::size_t n, std::align_val_t a) {
  return counted_or_throw(n, static_cast<std::size_t>(a));
}
void* operator new[](std::size_t n, std::align_val_t a) {
  return counted_or_throw(n, static_cast<std::size_t>(a));
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  return counted_allocation(n, 0);
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  return counted_allocation(n, 0);
}
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return counted_allocation(n, static_cast<std::size_t>(a));
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return counted_allocation(n, static_cast<std::size_t>(a));
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }

namespace sdalloc {
namespace {

using test::KiB;
using test::MiB;

class CachingPoolTest : public test::CachingPoolOnHost {};

TEST_F(CachingPoolTest, FreedBlockIsReusedOnSameStream) {
  CachingPool pool(upstream_, CachingPoolOptions{});
  void* a = pool.allocate(1000);
  pool.deallocate(a, 1000);
  void* b = pool.allocate(1000);
  EXPECT_EQ(a, b);
  EXPECT_EQ(upstream_.stats().allocations, 1u);
  pool.deallocate(b, 1000);
}

TEST_F(CachingPoolTest, SizesRoundUpTo512Bytes) {
  CachingPool pool(upstream_, CachingPoolOptions{});
  void* a = pool.allocate(1);
  void* b = pool.allocate(1);
  EXPECT_EQ(static_cast<char*>(b) - static_cast<char*>(a), 512);
  EXPECT_EQ(pool.stats().allocated_bytes, 1024u);
  EXPECT_EQ(pool.stats().live_bytes, 2u);
  pool.free(a);
  pool.free(b);
}

TEST_F(CachingPoolTest, SplitsASegmentForSmallRequests) {
  CachingPool pool(upstream_, CachingPoolOptions{});
  std::vector<void*> blocks;
  for (int i = 0; i < 16; ++i) blocks.push_back(pool.allocate(64 * KiB));
  EXPECT_EQ(pool.stats().segments, 1u);  // 16 x 64 KiB fit one 2 MiB segment
  EXPECT_EQ(pool.stats().reserved_bytes, 2 * MiB);
  for (void* p : blocks) pool.free(p);
  pool.check_invariants();
}

TEST_F(CachingPoolTest, CoalescesWithBothNeighbours) {
  CachingPool pool(upstream_, CachingPoolOptions{});
  void* a = pool.allocate(512 * KiB);
  void* b = pool.allocate(512 * KiB);
  void* c = pool.allocate(512 * KiB);
  pool.free(a);
  pool.free(c);
  pool.free(b);  // merges with a (before) and with c + the segment's tail (after)
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.largest_free_block, 2 * MiB);
  EXPECT_EQ(s.free_bytes, 2 * MiB);
  EXPECT_DOUBLE_EQ(s.fragmentation(), 0.0);
  pool.check_invariants();
}

TEST_F(CachingPoolTest, BestFitTakesTheSmallestBlockThatFits) {
  CachingPool pool(upstream_, CachingPoolOptions{});
  // Carve holes of 3 sizes separated by live blocks: 256 KiB, 64 KiB, 128 KiB.
  void* h1 = pool.allocate(256 * KiB);
  void* s1 = pool.allocate(512);
  void* h2 = pool.allocate(64 * KiB);
  void* s2 = pool.allocate(512);
  void* h3 = pool.allocate(128 * KiB);
  void* s3 = pool.allocate(512);
  pool.free(h1);
  pool.free(h2);
  pool.free(h3);
  EXPECT_EQ(pool.allocate(100 * KiB), h3);  // 128 KiB hole, not 256 KiB nor the tail
  EXPECT_EQ(pool.allocate(60 * KiB), h2);
  for (void* p : {h2, h3, s1, s2, s3}) pool.free(p);
  pool.check_invariants();
}

TEST_F(CachingPoolTest, HugeBlocksAreNotSplitForSmallRequests) {
  CachingPoolOptions options = CachingPoolOptions{};
  options.huge_threshold = 8 * MiB;
  options.release_cached_before_growth = false;  // keep the free huge segment cached
  CachingPool pool(upstream_, options);
  void* huge = pool.allocate(16 * MiB);
  pool.free(huge);
  void* small = pool.allocate(1 * MiB);
  EXPECT_EQ(pool.stats().segments, 2u);  // the small one got its own segment
  void* huge_again = pool.allocate(16 * MiB);
  EXPECT_EQ(huge_again, huge);
  pool.free(small);
  pool.free(huge_again);
  pool.check_invariants();
}

TEST_F(CachingPoolTest, HugeBlockIsReusedOnlyByCloseSizes) {
  CachingPoolOptions options = CachingPoolOptions{};
  options.huge_threshold = 8 * MiB;
  options.release_cached_before_growth = false;
  CachingPool pool(upstream_, options);
  void* big = pool.allocate(64 * MiB);
  pool.free(big);
  void* close = pool.allocate(60 * MiB);  // within 1/8: reuses the 64 MiB block whole
  EXPECT_EQ(close, big);
  EXPECT_EQ(pool.stats().allocated_bytes, 64 * MiB);
  pool.free(close);
  void* far = pool.allocate(16 * MiB);  // much smaller: gets its own segment
  EXPECT_NE(far, big);
  EXPECT_EQ(pool.stats().segments, 2u);
  pool.free(far);
}

TEST_F(CachingPoolTest, TrimReturnsWholeFreeSegments) {
  CachingPool pool(upstream_, CachingPoolOptions{});
  void* a = pool.allocate(3 * MiB);
  void* b = pool.allocate(5 * MiB);
  pool.free(a);
  EXPECT_EQ(pool.trim(), 4 * MiB);  // a's segment; b's stays
  EXPECT_EQ(pool.stats().reserved_bytes, 6 * MiB);
  EXPECT_EQ(upstream_.stats().current_bytes, 6 * MiB);
  pool.free(b);
  EXPECT_EQ(pool.trim(), 6 * MiB);
  EXPECT_EQ(upstream_.stats().current_bytes, 0u);
  pool.check_invariants();
}

TEST_F(CachingPoolTest, InitialReservationIsUsedAndKeptByTrim) {
  CachingPoolOptions options = CachingPoolOptions{};
  options.initial_reservation = 64 * MiB;
  CachingPool pool(upstream_, options);
  EXPECT_EQ(upstream_.stats().allocations, 1u);
  void* a = pool.allocate(10 * MiB);
  void* b = pool.allocate(1 * KiB);
  EXPECT_EQ(upstream_.stats().allocations, 1u);  // both served from the reservation
  pool.free(a);
  pool.free(b);
  EXPECT_EQ(pool.trim(), 0u);
  EXPECT_EQ(pool.stats().reserved_bytes, 64 * MiB);
}

TEST_F(CachingPoolTest, ReleasesCachedSegmentsBeforeRaisingItsPeak) {
  CachingPool pool(upstream_, CachingPoolOptions{});
  void* a = pool.allocate(4 * MiB);
  pool.free(a);
  // The cached 4 MiB segment cannot hold 6 MiB; growing would raise the peak to 10 MiB, so
  // the pool first returns the cached segment.
  void* b = pool.allocate(6 * MiB);
  EXPECT_EQ(pool.stats().peak_reserved_bytes, 6 * MiB);
  EXPECT_EQ(pool.stats().segment_releases, 1u);
  pool.free(b);
}

TEST_F(CachingPoolTest, KeepsCachedSegmentsWhenReleaseBeforeGrowthIsOff) {
  CachingPoolOptions options = CachingPoolOptions{};
  options.release_cached_before_growth = false;
  CachingPool pool(upstream_, options);
  pool.free(pool.allocate(4 * MiB));
  void* b = pool.allocate(6 * MiB);
  EXPECT_EQ(pool.stats().peak_reserved_bytes, 10 * MiB);
  EXPECT_EQ(pool.stats().segment_releases, 0u);
  pool.free(b);
}

// One iteration of a loop whose shapes make the pool release a segment and grow again.
void churning_iteration(CachingPool& pool) {
  void* x = pool.allocate(1 * MiB);  // lives through the iteration, in a 2 MiB segment
  void* a = pool.allocate(4 * MiB);  // a 4 MiB segment
  pool.free(a);
  void* c = pool.allocate(6 * MiB);  // growing past the peak: a's segment is released first
  pool.free(c);
  pool.free(x);  // the stream is empty now, holding 2 segments
}

TEST_F(CachingPoolTest, ConsolidatesAChurningStreamIntoOneArena) {
  CachingPool pool(upstream_, CachingPoolOptions{});
  churning_iteration(pool);
  // The stream is empty: consolidation is due, and happens at its next allocation.
  EXPECT_EQ(pool.stats().consolidations, 0u);
  void* next = pool.allocate(1 * MiB);
  PoolStats s = pool.stats();
  EXPECT_EQ(s.consolidations, 1u);
  EXPECT_EQ(s.segments, 1u);
  EXPECT_EQ(s.reserved_bytes, 8 * MiB);  // the peak footprint: 2 + 6 MiB
  pool.free(next);
  const std::uint64_t calls = upstream_.stats().allocations;
  for (int i = 0; i < 3; ++i) churning_iteration(pool);
  s = pool.stats();
  EXPECT_EQ(upstream_.stats().allocations, calls) << "later iterations run in the arena";
  EXPECT_EQ(s.consolidations, 1u);
  EXPECT_EQ(s.peak_reserved_bytes, 8 * MiB);
  pool.check_invariants();
}

// The free that empties a churned pool is often its last (the process exits, or
// the user dropped the pipeline). Consolidating there returned every segment and took a
// peak-sized one that nobody would use; it waits for the next allocation instead.
TEST_F(CachingPoolTest, TheLastFreeOfAChurnedPoolTakesNoNewSegment) {
  const std::uint64_t before_allocations = upstream_.stats().allocations;
  {
    CachingPool pool(upstream_, CachingPoolOptions{});
    churning_iteration(pool);
    const std::uint64_t taken = upstream_.stats().allocations;
    const PoolStats s = pool.stats();
    EXPECT_EQ(s.consolidations, 0u);
    EXPECT_EQ(s.segments, 2u) << "the segments stay as they were until the pool is used";
    EXPECT_EQ(upstream_.stats().allocations, taken);
    pool.check_invariants();
  }
  // 2 MiB for x, 4 MiB for a, 6 MiB for c: no arena at the end, at the free or at exit.
  EXPECT_EQ(upstream_.stats().allocations - before_allocations, 3u);
  EXPECT_EQ(upstream_.stats().current_bytes, 0u);
}

TEST_F(CachingPoolTest, TrimOfAPoolWithConsolidationDueReleasesAndTakesNothing) {
  CachingPool pool(upstream_, CachingPoolOptions{});
  churning_iteration(pool);
  const std::uint64_t taken = upstream_.stats().allocations;
  EXPECT_EQ(pool.trim(), 8 * MiB);
  EXPECT_EQ(upstream_.stats().allocations, taken);
  EXPECT_EQ(pool.stats().reserved_bytes, 0u);
  // Nothing is left to consolidate: the next allocation takes one segment of its own size.
  void* p = pool.allocate(1 * MiB);
  EXPECT_EQ(pool.stats().consolidations, 0u);
  EXPECT_EQ(pool.stats().reserved_bytes, 2 * MiB);
  pool.free(p);
  pool.check_invariants();
}

TEST_F(CachingPoolTest, DoesNotConsolidateWhenDisabled) {
  CachingPoolOptions options = CachingPoolOptions{};
  options.consolidate_when_empty = false;
  CachingPool pool(upstream_, options);
  for (int i = 0; i < 3; ++i) churning_iteration(pool);
  EXPECT_EQ(pool.stats().consolidations, 0u);
  EXPECT_EQ(pool.stats().segments, 2u);
}

TEST_F(CachingPoolTest, DoesNotConsolidateAStreamThatNeverReleased) {
  CachingPool pool(upstream_, CachingPoolOptions{});
  void* a = pool.allocate(2 * MiB);
  void* b = pool.allocate(2 * MiB);  // two segments, grown without releasing anything
  pool.free(a);
  pool.free(b);
  EXPECT_EQ(pool.stats().consolidations, 0u);
  EXPECT_EQ(pool.stats().segments, 2u);
}

TEST_F(CachingPoolTest, FreeSegmentMovesToAnotherStreamInsteadOfGrowing) {
  CachingPool pool(upstream_, CachingPoolOptions{});
  void* a = pool.allocate(8 * MiB, Stream{1});
  pool.free(a, Stream{1});
  void* b = pool.allocate(8 * MiB, Stream{2});
  EXPECT_EQ(b, a);
  EXPECT_EQ(upstream_.stats().allocations, 1u);
  pool.free(b, Stream{2});
  pool.check_invariants();
}

// Events that complete only when the test says so: models a device stream still running.
class ManualEvents final : public StreamEvents {
 public:
  Event record(Stream stream) override {
    recorded.push_back(stream);
    return ++next_;
  }
  bool query(Event e) override { return completed.count(e) != 0; }
  void synchronize(Event e) override {
    completed.insert(e);
    ++waits;
  }
  void release(Event e) override { released.insert(e); }
  bool idle(Stream) override { return busy_streams == 0; }

  std::vector<Stream> recorded;
  std::set<Event> completed;
  std::set<Event> released;
  int waits = 0;
  int busy_streams = 0;

 private:
  Event next_ = 0;
};

TEST_F(CachingPoolTest, CrossStreamFreeIsReusedOnlyAfterItsEvent) {
  ManualEvents events;
  CachingPoolOptions options = CachingPoolOptions{};
  options.stream_events = &events;
  CachingPool pool(upstream_, options);
  void* a = pool.allocate(1 * MiB, Stream{1});
  void* fill = pool.allocate(1 * MiB, Stream{1});  // the rest of the 2 MiB segment
  pool.free(a, Stream{2});  // freed on stream 2: stream 1 must wait for stream 2's work
  ASSERT_EQ(events.recorded.size(), 1u);
  EXPECT_EQ(events.recorded[0], Stream{2});
  EXPECT_EQ(pool.stats().pending_free_bytes, 1 * MiB);
  EXPECT_EQ(pool.stats().live_allocations, 1u);

  void* b = pool.allocate(1 * MiB, Stream{1});
  EXPECT_NE(b, a);  // event not complete: a new segment instead
  pool.free(b, Stream{1});

  events.completed.insert(1);
  void* big = pool.allocate(8 * MiB, Stream{1});  // a miss polls the event: a is free again
  EXPECT_EQ(pool.stats().pending_free_bytes, 0u);
  EXPECT_EQ(events.released.count(1), 1u);
  EXPECT_EQ(events.waits, 0);  // polled, never waited for
  void* again = pool.allocate(1 * MiB, Stream{1});
  EXPECT_EQ(again, a);  // best fit: a's 1 MiB hole beats the free 2 MiB segment
  for (void* p : {big, again, fill}) pool.free(p, Stream{1});
  pool.check_invariants();
}

TEST_F(CachingPoolTest, RecordStreamMakesTheFreeWaitForThatStream) {
  ManualEvents events;
  CachingPoolOptions options = CachingPoolOptions{};
  options.stream_events = &events;
  CachingPool pool(upstream_, options);
  void* a = pool.allocate(1 * MiB, Stream{1});
  pool.record_stream(a, Stream{3});
  pool.record_stream(a, Stream{3});  // recorded once
  pool.free(a, Stream{1});
  ASSERT_EQ(events.recorded.size(), 1u);
  EXPECT_EQ(events.recorded[0], Stream{3});
  EXPECT_EQ(pool.stats().pending_free_bytes, 1 * MiB);
  // trim waits for pending frees, then the segment is wholly free and released.
  EXPECT_EQ(pool.trim(), 2 * MiB);
  EXPECT_EQ(events.waits, 1);
  pool.check_invariants();
}

TEST_F(CachingPoolTest, CacheHitMakesNoSystemCallAndNoHeapAllocation) {
  CachingPool pool(upstream_, CachingPoolOptions{});
  // Warm up: the sizes of the loop below are cached after this.
  for (int i = 0; i < 4; ++i) {
    void* a = pool.allocate(1 * MiB);
    void* b = pool.allocate(4 * KiB);
    pool.free(b);
    pool.free(a);
  }
  const std::uint64_t upstream_calls = upstream_.stats().allocations;
  const std::size_t heap_before = g_heap_allocations.load();
  for (int i = 0; i < 10000; ++i) {
    void* a = pool.allocate(1 * MiB);
    void* b = pool.allocate(4 * KiB);
    pool.free(a);
    pool.free(b);
  }
  EXPECT_EQ(g_heap_allocations.load() - heap_before, 0u);
  EXPECT_EQ(upstream_.stats().allocations, upstream_calls);
}

TEST_F(CachingPoolTest, ResetPeakStartsANewHighWaterMark) {
  CachingPool pool(upstream_, CachingPoolOptions{});
  void* a = pool.allocate(6 * MiB);
  pool.free(a);
  EXPECT_EQ(pool.stats().peak_live_bytes, 6 * MiB);
  pool.reset_peak();
  EXPECT_EQ(pool.stats().peak_live_bytes, 0u);
  EXPECT_EQ(pool.stats().peak_reserved_bytes, 6 * MiB);  // still held
  void* b = pool.allocate(1 * MiB);
  EXPECT_EQ(pool.stats().peak_live_bytes, 1 * MiB);
  pool.free(b);
}

TEST_F(CachingPoolTest, DestructionReturnsEverySegment) {
  {
    CachingPool pool(upstream_, CachingPoolOptions{});
    (void)pool.allocate(3 * MiB);  // still live at destruction
    pool.free(pool.allocate(100 * MiB));
    void* c = pool.allocate(1 * MiB, Stream{5});
    pool.record_stream(c, Stream{6});
  }
  EXPECT_EQ(upstream_.stats().current_bytes, 0u);
}

}  // namespace
}  // namespace sdalloc
