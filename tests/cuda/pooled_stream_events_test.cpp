// PooledStreamEvents - the logic of CudaStreamEvents - over simulated events: events are
// reused, every one is destroyed at the end, misuse is rejected, and a CachingPool that uses
// it keeps cross-stream frees and record_stream pending until the other stream's work has
// finished, polling (never waiting) on the allocation path, with no new events once warm.
#include <gtest/gtest.h>

#include <cstddef>
#include <memory>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "fake_event_backend.hpp"
#include "pooled_stream_events.hpp"
#include "sdalloc/core/errors.hpp"
#include "sdalloc/policies/caching_pool.hpp"
#include "sdalloc/resources/host_resource.hpp"

namespace sdalloc::cuda {
namespace {

using test::FakeEventBackend;

constexpr std::size_t kKiB = 1024;
constexpr Stream kComputeStream{0x100};
constexpr Stream kCopyStream{0x200};

class PooledStreamEventsTest : public ::testing::Test {
 protected:
  PooledStreamEventsTest()
      : events_(std::make_unique<PooledStreamEvents>(
            std::make_unique<test::ForwardingEventBackend>(fake_))) {}

  FakeEventBackend fake_;  // declared first: outlives events_
  std::unique_ptr<PooledStreamEvents> events_;
};

TEST_F(PooledStreamEventsTest, ReleasedEventIsReusedInsteadOfCreated) {
  const auto first = events_->record(kComputeStream);
  EXPECT_NE(first, StreamEvents::kNoEvent);
  events_->release(first);
  const auto second = events_->record(kCopyStream);
  EXPECT_EQ(second, first);
  EXPECT_EQ(events_->events_created(), 1u);
  EXPECT_EQ(fake_.counts().creates, 1u);
  EXPECT_EQ(fake_.counts().records, 2u);
  events_->release(second);
  EXPECT_EQ(events_->events_pooled(), 1u);
}

TEST_F(PooledStreamEventsTest, EventsInUseAtOnceAreDistinct) {
  std::set<StreamEvents::Event> seen;
  std::vector<StreamEvents::Event> held;
  for (int i = 0; i < 8; ++i) {
    held.push_back(events_->record(kComputeStream));
    EXPECT_TRUE(seen.insert(held.back()).second) << "an event in use was handed out twice";
  }
  EXPECT_EQ(events_->events_in_use(), 8u);
  for (auto e : held) events_->release(e);
  EXPECT_EQ(events_->events_in_use(), 0u);
  EXPECT_EQ(events_->events_pooled(), 8u);
}

TEST_F(PooledStreamEventsTest, QueryFollowsTheStreamsWork) {
  fake_.launch(kComputeStream);
  const auto e = events_->record(kComputeStream);
  EXPECT_FALSE(events_->query(e));
  EXPECT_FALSE(events_->idle(kComputeStream));
  EXPECT_TRUE(events_->idle(kCopyStream));
  fake_.finish(kComputeStream);
  EXPECT_TRUE(events_->query(e));
  EXPECT_TRUE(events_->idle(kComputeStream));
  events_->release(e);
}

TEST_F(PooledStreamEventsTest, SynchronizeWaitsForTheEvent) {
  fake_.launch(kComputeStream);
  const auto e = events_->record(kComputeStream);
  events_->synchronize(e);
  EXPECT_TRUE(events_->query(e));
  EXPECT_EQ(fake_.counts().synchronizes, 1u);
  events_->release(e);
}

TEST_F(PooledStreamEventsTest, NoEventNeedsNoBackend) {
  EXPECT_TRUE(events_->query(StreamEvents::kNoEvent));
  events_->synchronize(StreamEvents::kNoEvent);
  events_->release(StreamEvents::kNoEvent);
  const auto counts = fake_.counts();
  EXPECT_EQ(counts.queries + counts.synchronizes, 0u);
}

TEST_F(PooledStreamEventsTest, DoubleReleaseIsRejectedAndChangesNothing) {
  const auto e = events_->record(kComputeStream);
  events_->release(e);
  EXPECT_THROW(events_->release(e), InvalidArgument);
  EXPECT_EQ(events_->events_pooled(), 1u) << "the rejected release must not pool it twice";
  EXPECT_THROW(events_->release(0xdead0), InvalidArgument);
  EXPECT_EQ(events_->events_pooled(), 1u);
  // Still usable, and the one event is not handed out twice.
  const auto a = events_->record(kComputeStream);
  const auto b = events_->record(kComputeStream);
  EXPECT_NE(a, b);
  events_->release(a);
  events_->release(b);
}

TEST_F(PooledStreamEventsTest, FailedRecordKeepsTheEventForLater) {
  fake_.fail_next_record();
  EXPECT_THROW((void)events_->record(kComputeStream), std::runtime_error);
  EXPECT_EQ(events_->events_in_use(), 0u);
  EXPECT_EQ(events_->events_pooled(), 1u);
  const auto e = events_->record(kComputeStream);
  EXPECT_EQ(events_->events_created(), 1u) << "the pooled event is reused";
  events_->release(e);
}

TEST_F(PooledStreamEventsTest, FailedCreateLeavesNothingBehind) {
  fake_.fail_next_create();
  EXPECT_THROW((void)events_->record(kComputeStream), std::runtime_error);
  EXPECT_EQ(events_->events_created(), 0u);
  EXPECT_EQ(events_->events_in_use(), 0u);
  const auto e = events_->record(kComputeStream);
  events_->release(e);
}

TEST(PooledStreamEvents, DestructionDestroysEveryEventCreated) {
  FakeEventBackend fake;
  {
    PooledStreamEvents events(std::make_unique<test::ForwardingEventBackend>(fake));
    const auto a = events.record(kComputeStream);
    const auto b = events.record(kCopyStream);
    events.release(a);
    (void)b;  // never released (against the rules): destroyed all the same
    EXPECT_EQ(fake.live_events(), 2u);
  }
  EXPECT_EQ(fake.live_events(), 0u);
  EXPECT_EQ(fake.counts().destroys, 2u);
  EXPECT_EQ(fake.counts().misuses, 0u);
}

TEST_F(PooledStreamEventsTest, ConcurrentRecordAndReleaseNeverShareAnEvent) {
  constexpr int kThreads = 4;
  constexpr int kRounds = 2000;
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([this, t] {
      const Stream stream{static_cast<std::uintptr_t>(0x100 * (t + 1))};
      for (int i = 0; i < kRounds; ++i) {
        const auto e = events_->record(stream);
        EXPECT_TRUE(events_->query(e));
        events_->release(e);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(events_->events_in_use(), 0u);
  EXPECT_LE(events_->events_created(), static_cast<std::size_t>(kThreads));
  EXPECT_EQ(fake_.counts().misuses, 0u);
}

// --- a CachingPool driven through the pooled events ----------------------------------------

class PoolWithPooledEvents : public PooledStreamEventsTest {
 protected:
  HostResource host_;
};

TEST_F(PoolWithPooledEvents, CrossStreamFreeWaitsForTheOtherStreamsWork) {
  CachingPoolOptions options;
  options.stream_events = events_.get();
  CachingPool pool(host_, options);
  constexpr std::size_t kSize = 64 * kKiB;

  void* block = pool.allocate(kSize, kComputeStream);
  fake_.launch(kCopyStream);                   // the copy stream still reads the block...
  pool.deallocate(block, kSize, kCopyStream);  // ...when it is freed there
  EXPECT_EQ(pool.stats().pending_free_bytes, 64 * kKiB);

  void* next = pool.allocate(kSize, kComputeStream);
  EXPECT_NE(next, block) << "reused while the copy stream's work was unfinished";
  EXPECT_EQ(fake_.counts().synchronizes, 0u) << "the allocation path must only poll";
  EXPECT_GE(fake_.counts().queries, 1u) << "the allocation path polls pending events";
  pool.deallocate(next, kSize, kComputeStream);

  fake_.finish(kCopyStream);
  void* again = pool.allocate(kSize, kComputeStream);
  void* again2 = pool.allocate(kSize, kComputeStream);
  EXPECT_TRUE(again == block || again2 == block) << "not reused once the work finished";
  EXPECT_EQ(pool.stats().pending_free_bytes, 0u);
  EXPECT_EQ(events_->events_in_use(), 0u) << "the completed event went back to the pool";
  pool.deallocate(again, kSize, kComputeStream);
  pool.deallocate(again2, kSize, kComputeStream);
  EXPECT_NO_THROW(pool.check_invariants());
}

TEST_F(PoolWithPooledEvents, RecordStreamIsHonoured) {
  CachingPoolOptions options;
  options.stream_events = events_.get();
  CachingPool pool(host_, options);
  constexpr std::size_t kSize = 64 * kKiB;

  void* block = pool.allocate(kSize, kComputeStream);
  pool.record_stream(block, kCopyStream);  // also used by the copy stream
  fake_.launch(kCopyStream);
  pool.deallocate(block, kSize, kComputeStream);  // freed on its own stream
  EXPECT_EQ(fake_.counts().records, 1u) << "one event on the recorded stream";

  void* next = pool.allocate(kSize, kComputeStream);
  EXPECT_NE(next, block) << "reused while the recorded stream still used it";
  fake_.finish(kCopyStream);
  void* later = pool.allocate(kSize, kComputeStream);
  EXPECT_EQ(later, block);
  pool.deallocate(next, kSize, kComputeStream);
  pool.deallocate(later, kSize, kComputeStream);
  EXPECT_EQ(events_->events_in_use(), 0u);
}

TEST_F(PoolWithPooledEvents, SteadyCrossStreamTrafficCreatesNoNewEvents) {
  CachingPoolOptions options;
  options.stream_events = events_.get();
  CachingPool pool(host_, options);
  constexpr std::size_t kSize = 32 * kKiB;
  for (int i = 0; i < 200; ++i) {
    void* p = pool.allocate(kSize, kComputeStream);
    fake_.launch(kCopyStream);
    pool.deallocate(p, kSize, kCopyStream);
    fake_.finish(kCopyStream);
  }
  EXPECT_EQ(fake_.counts().records, 200u);
  RecordProperty("events_created", static_cast<int>(events_->events_created()));
  EXPECT_LE(events_->events_created(), 2u) << "events must be reused, not created per free";
  EXPECT_EQ(fake_.counts().synchronizes, 0u);
  pool.trim();
  EXPECT_EQ(events_->events_in_use(), 0u);
}

TEST_F(PoolWithPooledEvents, TrimWaitsForPendingFrees) {
  CachingPoolOptions options;
  options.stream_events = events_.get();
  CachingPool pool(host_, options);
  void* p = pool.allocate(4 * kKiB, kComputeStream);
  fake_.launch(kCopyStream);
  pool.deallocate(p, 4 * kKiB, kCopyStream);
  EXPECT_GT(pool.trim(), 0u) << "the segment is released after waiting";
  EXPECT_GE(fake_.counts().synchronizes, 1u);
  EXPECT_EQ(pool.stats().reserved_bytes, 0u);
  EXPECT_EQ(events_->events_in_use(), 0u);
}

TEST_F(PoolWithPooledEvents, PoolDestructionReleasesItsPendingEvents) {
  {
    CachingPoolOptions options;
    options.stream_events = events_.get();
    CachingPool pool(host_, options);
    void* p = pool.allocate(4 * kKiB, kComputeStream);
    fake_.launch(kCopyStream);
    pool.deallocate(p, 4 * kKiB, kCopyStream);
    EXPECT_EQ(events_->events_in_use(), 1u);
  }
  EXPECT_EQ(events_->events_in_use(), 0u);
  EXPECT_EQ(fake_.counts().misuses, 0u);
}

}  // namespace
}  // namespace sdalloc::cuda
