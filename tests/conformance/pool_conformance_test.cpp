// pool_conformance_test.cpp - what every CachingPool configuration must do beyond a resource.
//
// Typed over PoolConfigurations (resource_configurations.hpp). Covers the pool's own API
// (alignment, size-less free, trim, peaks, record_stream) on the configured stack, and, on
// stacks built here with each configuration's options:
//  - a 64 MiB "card" (LimitResource) exhausted and recovered from;
//  - the cross-stream rules, with ControlledStreamEvents standing in for a device: a block
//    freed on another stream is not handed out before its event completes, is handed out
//    after, the allocation path never waits, and trim() / out-of-memory do wait.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "conformance/controlled_stream_events.hpp"
#include "conformance/random_sequence.hpp"
#include "conformance/reference_model.hpp"
#include "conformance/resource_configurations.hpp"
#include "sdalloc/core/errors.hpp"

namespace sdalloc::conformance {
namespace {

constexpr Stream kStream1{1};
constexpr Stream kStream2{2};

bool overlaps(const void* a, std::size_t a_size, const void* b, std::size_t b_size) {
  const auto a_begin = reinterpret_cast<std::uintptr_t>(a);
  const auto b_begin = reinterpret_cast<std::uintptr_t>(b);
  return a_begin < b_begin + b_size && b_begin < a_begin + a_size;
}

template <typename Config>
class PoolConformance : public ::testing::Test {
 protected:
  MemoryResource& resource() { return config_.resource(); }
  CachingPool& pool() { return config_.pool(); }
  ReferenceModel new_model() const { return ReferenceModel(Config::kGuaranteedAlignment); }

  void free_all(ReferenceModel& model) {
    while (!model.empty()) {
      auto [address, entry] = *model.live().begin();
      void* ptr = reinterpret_cast<void*>(address);
      ASSERT_TRUE(model.remove(ptr));
      resource().deallocate(ptr, entry.size, entry.stream);
    }
  }

  // The configuration's options with the test's stream events.
  static CachingPoolOptions options_with(StreamEvents& events) {
    CachingPoolOptions options = Config::pool_options();
    options.stream_events = &events;
    return options;
  }

  Config config_;
};

TYPED_TEST_SUITE(PoolConformance, PoolConfigurations, ConfigurationName);

// ---- the pool's own API ---------------------------------------------------------------------

TYPED_TEST(PoolConformance, StricterAlignmentsAreHonoured) {
  CachingPool& pool = this->pool();
  ReferenceModel model = this->new_model();
  std::vector<std::pair<void*, std::size_t>> held;
  const std::size_t alignments[] = {1, 2, 256, 512, 1024, 4096, 64 * kKiB, 2 * kMiB};
  const std::size_t sizes[] = {1, 1000, 5000, 3 * kMiB + 7};
  for (const std::size_t alignment : alignments) {
    for (const std::size_t size : sizes) {
      void* ptr = pool.allocate(size, alignment, kStream1);
      ASSERT_TRUE(model.add(ptr, size, kStream1)) << "alignment " << alignment;
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(ptr) % alignment, 0u)
          << "size " << size << ", alignment " << alignment;
      EXPECT_EQ(pool.allocation_size(ptr), size);
    }
  }
  // The largest alignment the pool promises.
  void* max_aligned = pool.allocate(4096, CachingPool::kMaxAlignment, kStream1);
  ASSERT_TRUE(model.add(max_aligned, 4096, kStream1));
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(max_aligned) % CachingPool::kMaxAlignment, 0u);
  expect_pool_matches(pool, model);

  while (!model.empty()) {
    void* ptr = reinterpret_cast<void*>(model.live().begin()->first);
    const std::size_t size = model.live().begin()->second.size;
    ASSERT_TRUE(model.remove(ptr));
    pool.deallocate(ptr, size, kStream1);
  }
  expect_pool_matches(pool, model);
}

TYPED_TEST(PoolConformance, SizelessFreeReleasesTheAllocation) {
  CachingPool& pool = this->pool();
  ReferenceModel model = this->new_model();
  for (const std::size_t size : {std::size_t{1}, std::size_t{70000}, 5 * kMiB, 200 * kMiB}) {
    void* ptr = pool.allocate(size, 512, kStream1);
    ASSERT_TRUE(model.add(ptr, size, kStream1));
    EXPECT_EQ(pool.allocation_size(ptr), size);
  }
  expect_pool_matches(pool, model);
  while (!model.empty()) {
    void* ptr = reinterpret_cast<void*>(model.live().begin()->first);
    ASSERT_TRUE(model.remove(ptr));
    pool.free(ptr, kStream1);
  }
  expect_pool_matches(pool, model);
  EXPECT_EQ(pool.stats().frees, 4u);
}

// A block held throughout keeps the stream from emptying: a stream that empties after it
// released segments to grow is consolidated at its next allocation (caching_pool.hpp), which
// is no cache hit.
TYPED_TEST(PoolConformance, FreedBlockIsReusedAtOnceOnItsStream) {
  CachingPool& pool = this->pool();
  void* anchor = this->resource().allocate(512, kStream1);
  for (const std::size_t size : {std::size_t{4096}, 300 * kKiB, 3 * kMiB, 200 * kMiB}) {
    SCOPED_TRACE("size " + std::to_string(size));
    void* first = this->resource().allocate(size, kStream1);
    this->resource().deallocate(first, size, kStream1);
    const std::uint64_t segments = pool.stats().segment_allocations;
    void* again = this->resource().allocate(size, kStream1);
    EXPECT_EQ(again, first) << "the only free block of the stream is the best fit";
    EXPECT_EQ(pool.stats().segment_allocations, segments) << "a cache hit takes no segment";
    this->resource().deallocate(again, size, kStream1);
  }
  this->resource().deallocate(anchor, 512, kStream1);
}

TYPED_TEST(PoolConformance, TrimReturnsEveryWhollyFreeSegment) {
  CachingPool& pool = this->pool();
  const std::size_t initial = pool.options().initial_reservation;
  ReferenceModel model = this->new_model();
  std::mt19937_64 rng(42);
  SequenceShape shape;
  shape.operations = scaled_operations<TypeParam>(600);
  shape.streams = {kStream1, kStream2};
  ASSERT_TRUE(run_random_sequence(this->resource(), model, rng, shape));
  // Everything is free now, and cached.
  const PoolStats cached = pool.stats();
  ASSERT_GT(cached.reserved_bytes, initial) << "the sequence should have grown the pool";

  const std::size_t released = pool.trim();
  const PoolStats trimmed = pool.stats();
  EXPECT_EQ(released, cached.reserved_bytes - initial);
  EXPECT_EQ(trimmed.reserved_bytes, initial) << "only the initial reservation is kept";
  EXPECT_EQ(trimmed.segments, initial > 0 ? 1u : 0u);
  EXPECT_EQ(trimmed.peak_reserved_bytes, cached.peak_reserved_bytes) << "trim keeps peaks";
  this->config_.expect_accounting(model);

  // With live allocations, only the wholly free segments go.
  void* small = this->resource().allocate(1000, kStream1);
  ASSERT_TRUE(model.add(small, 1000, kStream1));
  void* big = this->resource().allocate(200 * kMiB, kStream1);
  ASSERT_TRUE(model.add(big, 200 * kMiB, kStream1));
  ASSERT_TRUE(model.remove(big));
  this->resource().deallocate(big, 200 * kMiB, kStream1);
  const std::size_t before = pool.stats().reserved_bytes;
  EXPECT_GE(pool.trim(), 200 * kMiB);
  EXPECT_LE(pool.stats().reserved_bytes, before - 200 * kMiB);
  EXPECT_GE(pool.stats().reserved_bytes, initial);
  this->config_.expect_accounting(model);
  this->free_all(model);
  pool.trim();
  EXPECT_EQ(pool.stats().reserved_bytes, initial);
  this->config_.expect_accounting(model);
  // And the pool still serves requests after giving everything back.
  void* after = this->resource().allocate(3 * kMiB, kStream1);
  ASSERT_TRUE(model.add(after, 3 * kMiB, kStream1));
  this->free_all(model);
  this->config_.expect_accounting(model);
}

TYPED_TEST(PoolConformance, ResetPeakSetsPeaksToCurrentFigures) {
  CachingPool& pool = this->pool();
  ReferenceModel model = this->new_model();
  void* big = this->resource().allocate(32 * kMiB, kStream1);
  ASSERT_TRUE(model.add(big, 32 * kMiB, kStream1));
  void* small = this->resource().allocate(5000, kStream1);
  ASSERT_TRUE(model.add(small, 5000, kStream1));
  ASSERT_TRUE(model.remove(big));
  this->resource().deallocate(big, 32 * kMiB, kStream1);
  pool.trim();  // reserved drops below its peak too

  const PoolStats before = pool.stats();
  ASSERT_GT(before.peak_live_bytes, before.live_bytes);
  pool.reset_peak();
  const PoolStats reset = pool.stats();
  EXPECT_EQ(reset.peak_live_bytes, reset.live_bytes);
  EXPECT_EQ(reset.peak_allocated_bytes, reset.allocated_bytes);
  EXPECT_EQ(reset.peak_reserved_bytes, reset.reserved_bytes);
  EXPECT_EQ(reset.peak_live_allocations, reset.live_allocations);
  EXPECT_EQ(reset.peak_segments, reset.segments);
  // Counters are not peaks: reset_peak leaves them alone.
  EXPECT_EQ(reset.allocations, before.allocations);
  EXPECT_EQ(reset.frees, before.frees);
  EXPECT_EQ(reset.segment_allocations, before.segment_allocations);
  EXPECT_EQ(reset.live_bytes, before.live_bytes);

  void* more = this->resource().allocate(7 * kMiB, kStream1);
  ASSERT_TRUE(model.add(more, 7 * kMiB, kStream1));
  const PoolStats grown = pool.stats();
  EXPECT_EQ(grown.peak_live_bytes, 5000 + 7 * kMiB);
  EXPECT_EQ(grown.peak_live_allocations, 2u);
  EXPECT_GE(grown.peak_reserved_bytes, grown.reserved_bytes);
  this->config_.expect_accounting(model);
  this->free_all(model);
  EXPECT_EQ(pool.stats().peak_live_bytes, 5000 + 7 * kMiB) << "peaks stay after frees";
}

TYPED_TEST(PoolConformance, RecordStreamOnHostPoolIsAcceptedAndFreesNormally) {
  CachingPool& pool = this->pool();
  ReferenceModel model = this->new_model();
  void* anchor = this->resource().allocate(512, kStream1);  // as in the test above
  ASSERT_TRUE(model.add(anchor, 512, kStream1));
  for (const std::size_t size : {std::size_t{1000}, 3 * kMiB}) {
    void* ptr = this->resource().allocate(size, kStream1);
    ASSERT_TRUE(model.add(ptr, size, kStream1));
    EXPECT_NO_THROW(pool.record_stream(ptr, kStream2));
    EXPECT_NO_THROW(pool.record_stream(ptr, Stream{3}));
    EXPECT_NO_THROW(pool.record_stream(ptr, kStream1));  // its own stream: nothing to do
    ASSERT_TRUE(model.remove(ptr));
    this->resource().deallocate(ptr, size, kStream1);
    this->config_.expect_accounting(model);  // host events: nothing left pending

    const std::uint64_t segments = pool.stats().segment_allocations;
    void* again = this->resource().allocate(size, kStream1);
    ASSERT_TRUE(model.add(again, size, kStream1));
    EXPECT_EQ(pool.stats().segment_allocations, segments) << "the block is reusable at once";
    ASSERT_TRUE(model.remove(again));
    this->resource().deallocate(again, size, kStream1);
  }
  ASSERT_TRUE(model.remove(anchor));
  this->resource().deallocate(anchor, 512, kStream1);
  this->config_.expect_accounting(model);
}

// ---- a 64 MiB card --------------------------------------------------------------------------

TYPED_TEST(PoolConformance, ExhaustingA64MiBCardThrowsOutOfMemoryAndRecovers) {
  constexpr std::size_t kCard = 64 * kMiB;
  HostResource host;
  LimitResource card(host, kCard);
  CachingPool pool(card, TypeParam::pool_options());
  ReferenceModel model = this->new_model();

  const std::size_t sizes[] = {3 * kMiB + 512, 700 * kKiB, 5 * kMiB, 100, 9 * kMiB, 2 * kMiB};
  std::size_t failed_size = 0;
  for (std::size_t i = 0; failed_size == 0; ++i) {
    ASSERT_LT(i, 1000u) << "a 64 MiB card never ran out";
    const std::size_t size = sizes[i % std::size(sizes)];
    const PoolStats before = pool.stats();
    try {
      void* ptr = pool.allocate(size, kStream1);
      ASSERT_TRUE(model.add(ptr, size, kStream1));
    } catch (const OutOfMemory& e) {
      failed_size = size;
      const std::string message = e.what();
      for (const char* word : {"live", "reserved", "largest free", "capacity"}) {
        EXPECT_NE(message.find(word), std::string::npos) << "no \"" << word << "\" in: " << message;
      }
      const PoolStats after = pool.stats();
      EXPECT_EQ(e.info.requested, size) << message;
      EXPECT_EQ(e.info.capacity, kCard) << message;
      EXPECT_EQ(e.info.live, model.totals().bytes) << message;
      EXPECT_EQ(e.info.reserved, after.reserved_bytes) << message;
      EXPECT_LT(e.info.largest_free, size) << "refused a request it had a free block for";
      EXPECT_EQ(after.live_bytes, before.live_bytes);
      EXPECT_EQ(after.live_allocations, before.live_allocations);
      EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
      EXPECT_EQ(after.allocations, before.allocations);
      EXPECT_EQ(after.ooms, before.ooms + 1);
      EXPECT_LE(after.reserved_bytes, kCard);
    }
  }
  EXPECT_GT(model.totals().bytes + failed_size, kCard / 2)
      << "ran out with most of the card unused";
  expect_pool_matches(pool, model);
  expect_limit_matches(card, pool.stats().reserved_bytes);

  // Everything still works: free all, and a request needing most of the card succeeds
  // (the pool gives back whatever it cached in the wrong shape).
  while (!model.empty()) {
    void* ptr = reinterpret_cast<void*>(model.live().begin()->first);
    const std::size_t size = model.live().begin()->second.size;
    ASSERT_TRUE(model.remove(ptr));
    pool.deallocate(ptr, size, kStream1);
  }
  expect_pool_matches(pool, model);
  for (const std::size_t size : {48 * kMiB, 60 * kMiB, kCard}) {
    void* ptr = nullptr;
    ASSERT_NO_THROW(ptr = pool.allocate(size, kStream2)) << "size " << size;
    ASSERT_TRUE(model.add(ptr, size, kStream2));
    ASSERT_TRUE(model.remove(ptr));
    pool.deallocate(ptr, size, kStream2);
    expect_pool_matches(pool, model);
  }
}

// ---- cross-stream rules, with events the test completes ------------------------------------

// Allocates `size` on `stream`, keeping the results in `held`, until a result overlaps
// [pending, pending + size) (returns true) or the pool takes a new segment (returns false).
bool allocate_until_growth(CachingPool& pool, Stream stream, std::size_t size, const void* pending,
                           std::vector<void*>& held) {
  const std::uint64_t segments = pool.stats().segment_allocations;
  for (int i = 0; i < 4096; ++i) {
    void* ptr = pool.allocate(size, stream);
    held.push_back(ptr);
    if (overlaps(ptr, size, pending, size)) {
      return true;
    }
    if (pool.stats().segment_allocations > segments) return false;
  }
  ADD_FAILURE() << "the pool neither grew nor reused the block in 4096 allocations";
  return false;
}

TYPED_TEST(PoolConformance, CrossStreamFreeIsNotReusedBeforeItsEventCompletes) {
  constexpr std::size_t kSize = 256 * kKiB;
  ControlledStreamEvents events;
  HostResource host;
  CachingPool pool(host, this->options_with(events));

  void* pending = pool.allocate(kSize, kStream1);
  pool.deallocate(pending, kSize, kStream2);  // stream 2's work may still use it
  EXPECT_GE(events.recorded_on(kStream2), 1u) << "a cross-stream free records an event";
  EXPECT_GE(pool.stats().pending_free_bytes, kSize);
  EXPECT_EQ(pool.stats().live_bytes, 0u);

  std::vector<void*> held;
  const bool early = allocate_until_growth(pool, kStream1, kSize, pending, held);
  EXPECT_FALSE(early && !events.all_complete())
      << "the block was handed out on stream 1 before stream 2's event completed";
  EXPECT_EQ(events.synchronizations(), 0u) << "the allocation path must not wait for events";
  EXPECT_NO_THROW(pool.check_invariants());

  events.complete_all();  // stream 2 finished
  const bool reused = allocate_until_growth(pool, kStream1, kSize, pending, held);
  EXPECT_TRUE(reused) << "once its event completed, the block must be reused before the pool "
                         "grows";
  EXPECT_EQ(pool.stats().pending_free_bytes, 0u);
  for (void* ptr : held) pool.deallocate(ptr, kSize, kStream1);
  EXPECT_NO_THROW(pool.check_invariants());
  EXPECT_EQ(events.unreleased(), 0u) << "every event is released once nothing waits on it";
  EXPECT_EQ(events.misuses(), 0u) << "an unknown or released event was used";
}

TYPED_TEST(PoolConformance, RecordedStreamDelaysReuseUntilItsEventCompletes) {
  constexpr std::size_t kSize = 256 * kKiB;
  ControlledStreamEvents events;
  HostResource host;
  CachingPool pool(host, this->options_with(events));

  void* shared = pool.allocate(kSize, kStream1);
  pool.record_stream(shared, kStream2);  // stream 2 also reads it
  const std::size_t recorded_before = events.recorded_on(kStream2);
  pool.deallocate(shared, kSize, kStream1);
  EXPECT_GT(events.recorded_on(kStream2), recorded_before)
      << "the free must record an event on the recorded stream (work queued until the free)";

  std::vector<void*> held;
  const bool early = allocate_until_growth(pool, kStream1, kSize, shared, held);
  EXPECT_FALSE(early && !events.all_complete())
      << "the block was handed out before the recorded stream's event completed";
  EXPECT_EQ(events.synchronizations(), 0u);

  events.complete_all();
  EXPECT_TRUE(allocate_until_growth(pool, kStream1, kSize, shared, held))
      << "once the event completed, the block must be reused before the pool grows";
  for (void* ptr : held) pool.deallocate(ptr, kSize, kStream1);
  EXPECT_NO_THROW(pool.check_invariants());
  EXPECT_EQ(events.unreleased(), 0u);
  EXPECT_EQ(events.misuses(), 0u);
}

TYPED_TEST(PoolConformance, FreeSegmentOfABusyStreamIsNotTakenByAnotherStream) {
  // A segment whose blocks were all freed on stream 1 is wholly free, but stream 1's work may
  // still use it: another stream may take it only once an event on stream 1 has completed,
  // and the allocation path polls that event, it never waits for it.
  constexpr std::size_t kSize = 256 * kKiB;
  ControlledStreamEvents events;
  HostResource host;
  CachingPool pool(host, this->options_with(events));
  void* busy = pool.allocate(kSize, kStream1);
  pool.deallocate(busy, kSize, kStream1);  // reusable at once on stream 1 only

  void* other = pool.allocate(kSize, kStream2);
  EXPECT_FALSE(overlaps(other, kSize, busy, kSize) && !events.all_complete())
      << "stream 2 got memory that stream 1's unfinished work may still use";
  EXPECT_EQ(events.synchronizations(), 0u) << "the allocation path must not wait for events";
  pool.deallocate(other, kSize, kStream2);

  events.complete_all();
  void* third = pool.allocate(kSize, Stream{3});
  EXPECT_FALSE(overlaps(third, kSize, busy, kSize) && !events.all_complete());
  pool.deallocate(third, kSize, Stream{3});
  pool.trim();
  EXPECT_NO_THROW(pool.check_invariants());
  EXPECT_EQ(events.unreleased(), 0u);
  EXPECT_EQ(events.misuses(), 0u);
}

TYPED_TEST(PoolConformance, TrimWaitsForPendingFrees) {
  constexpr std::size_t kSize = 3 * kMiB;
  ControlledStreamEvents events;
  HostResource host;
  CachingPool pool(host, this->options_with(events));
  const std::size_t initial = pool.options().initial_reservation;

  void* pending = pool.allocate(kSize, kStream1);
  void* other = pool.allocate(200 * kMiB, kStream1);
  pool.deallocate(other, 200 * kMiB, kStream2);
  pool.deallocate(pending, kSize, kStream2);
  ASSERT_GE(pool.stats().pending_free_bytes, kSize + 200 * kMiB);
  const std::size_t reserved = pool.stats().reserved_bytes;

  const std::size_t released = pool.trim();
  EXPECT_GE(events.synchronizations(), 1u) << "trim waits for pending cross-stream frees";
  EXPECT_TRUE(events.all_complete());
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.pending_free_bytes, 0u);
  EXPECT_EQ(s.reserved_bytes, initial);
  EXPECT_EQ(released, reserved - initial);
  EXPECT_NO_THROW(pool.check_invariants());
  EXPECT_EQ(events.unreleased(), 0u);
  EXPECT_EQ(events.misuses(), 0u);
}

TYPED_TEST(PoolConformance, OutOfMemoryPathWaitsForPendingFrees) {
  constexpr std::size_t kCard = 64 * kMiB;
  constexpr std::size_t kSize = 40 * kMiB;  // two do not fit on the card
  ControlledStreamEvents events;
  HostResource host;
  LimitResource card(host, kCard);
  CachingPool pool(card, this->options_with(events));

  void* pending = pool.allocate(kSize, kStream1);
  pool.deallocate(pending, kSize, kStream2);
  EXPECT_EQ(events.synchronizations(), 0u) << "the allocation path must not wait for events";

  void* next = nullptr;
  ASSERT_NO_THROW(next = pool.allocate(kSize, kStream1))
      << "the pool must wait for the pending free before giving up";
  EXPECT_GE(events.synchronizations(), 1u) << "only waiting makes the memory available";
  EXPECT_FALSE(overlaps(next, kSize, pending, kSize) && !events.all_complete())
      << "handed out before its event completed";
  EXPECT_GE(pool.stats().oom_retries, 1u);
  EXPECT_EQ(pool.stats().ooms, 0u) << "the retry succeeded: no OutOfMemory was thrown";
  pool.deallocate(next, kSize, kStream1);
  EXPECT_NO_THROW(pool.check_invariants());
  expect_limit_matches(card, pool.stats().reserved_bytes);
  EXPECT_EQ(events.unreleased(), 0u);
  EXPECT_EQ(events.misuses(), 0u);
}

}  // namespace
}  // namespace sdalloc::conformance
