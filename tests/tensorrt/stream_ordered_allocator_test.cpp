// stream_ordered_allocator_test.cpp - TensorRT's allocator contract without TensorRT:
// StreamOrderedAllocator over a host CachingPool whose stream events the test completes
// (alignment, zero size, flags, stream-ordered reuse, errors as nullptr / false).
#include "sdalloc/tensorrt/stream_ordered_allocator.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "conformance/controlled_stream_events.hpp"
#include "sdalloc/resources/host_resource.hpp"
#include "sdalloc/resources/limit_resource.hpp"

namespace sdalloc::tensorrt {
namespace {

const Stream kS1{1};
const Stream kS2{2};

class StreamOrderedAllocatorTest : public ::testing::Test {
 protected:
  std::shared_ptr<AnyPool> make_pool(MemoryResource& upstream) {
    CachingPoolOptions options;
    options.stream_events = &events_;
    return std::make_shared<PoolOf<CachingPool>>(upstream, options);
  }

  HostResource host_;
  conformance::ControlledStreamEvents events_;
};

TEST_F(StreamOrderedAllocatorTest, ZeroSizeIsNullptrAndNoFailure) {
  StreamOrderedAllocator a(make_pool(host_), CachingPool::kMaxAlignment);
  EXPECT_EQ(a.allocate_async(0, 256, 0, kS1), nullptr);
  EXPECT_EQ(a.counters().failed_allocations, 0u);
}

TEST_F(StreamOrderedAllocatorTest, AlignmentIsHonouredAndBadOnesAreNullptr) {
  StreamOrderedAllocator a(make_pool(host_), CachingPool::kMaxAlignment);
  for (const std::uint64_t alignment : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{64},
                                        std::uint64_t{256}, std::uint64_t{4096}}) {
    void* p = a.allocate_async(1000, alignment, 0, kS1);
    ASSERT_NE(p, nullptr) << alignment;
    const std::uint64_t want = alignment < 256 ? 256 : alignment;
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % want, 0u) << alignment;
    EXPECT_TRUE(a.deallocate_async(p, kS1));
  }
  EXPECT_EQ(a.allocate_async(1000, 3, 0, kS1), nullptr);  // not a power of two
  EXPECT_EQ(a.allocate_async(1000, CachingPool::kMaxAlignment * 2, 0, kS1), nullptr);
  EXPECT_EQ(a.counters().failed_allocations, 2u);
  EXPECT_NE(a.last_error(), "");
}

TEST_F(StreamOrderedAllocatorTest, ResizableFlagIsAcceptedUnknownFlagsAreRefused) {
  StreamOrderedAllocator a(make_pool(host_), CachingPool::kMaxAlignment);
  void* p = a.allocate_async(4096, 256, kResizableFlag, kS1);
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(a.deallocate_async(p, kS1));
  EXPECT_EQ(a.allocate_async(4096, 256, 1U << 5, kS1), nullptr);
  EXPECT_EQ(a.counters().failed_allocations, 1u);
}

TEST_F(StreamOrderedAllocatorTest, FreedMemoryIsReusedAtOnceOnItsStreamOnlyLaterOnAnother) {
  StreamOrderedAllocator a(make_pool(host_), CachingPool::kMaxAlignment);
  void* p = a.allocate_async(1 << 20, 256, 0, kS1);
  ASSERT_NE(p, nullptr);
  ASSERT_TRUE(a.deallocate_async(p, kS1));
  // Stream order: later work on S1 runs after the free, so the block is reused at once.
  void* again = a.allocate_async(1 << 20, 256, 0, kS1);
  EXPECT_EQ(again, p);
  // Freed on S1, needed on S2: S1 may still be using it until its work completes.
  ASSERT_TRUE(a.deallocate_async(again, kS1));
  void* other = a.allocate_async(1 << 20, 256, 0, kS2);
  ASSERT_NE(other, nullptr);
  EXPECT_NE(other, p);
  EXPECT_TRUE(a.deallocate_async(other, kS2));
  events_.complete_all();
  a.pool().check_invariants();
}

TEST_F(StreamOrderedAllocatorTest, MemoryFreedOnAnotherStreamWaitsForThatStreamsWork) {
  StreamOrderedAllocator a(make_pool(host_), CachingPool::kMaxAlignment);
  void* p = a.allocate_async(1 << 20, 256, 0, kS1);
  ASSERT_NE(p, nullptr);
  ASSERT_TRUE(a.deallocate_async(p, kS2));  // freed in S2's order: pending until S2 is done
  EXPECT_GT(a.stats().pending_free_bytes, 0u);
  events_.complete_all();
  void* q = a.allocate_async(1 << 20, 256, 0, kS1);
  EXPECT_EQ(q, p);  // S2's work as of the free is complete: S1 reuses the block
  EXPECT_TRUE(a.deallocate_async(q, kS1));
}

TEST_F(StreamOrderedAllocatorTest, ErrorsAreNullptrOrFalseNeverExceptions) {
  LimitResource small(host_, 4u << 20);
  StreamOrderedAllocator a(make_pool(small), CachingPool::kMaxAlignment);
  EXPECT_EQ(a.allocate_async(std::uint64_t{64} << 20, 256, 0, kS1), nullptr);  // beyond the cap
  EXPECT_EQ(a.allocate_async(~std::uint64_t{0}, 256, 0, kS1), nullptr);        // absurd size
  EXPECT_EQ(a.counters().failed_allocations, 2u);
  int not_ours = 0;
  EXPECT_FALSE(a.deallocate_async(&not_ours, kS1));
  EXPECT_FALSE(a.deallocate_async(nullptr, kS1));
  void* p = a.allocate_async(4096, 256, 0, kS1);
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(a.deallocate_async(p, kS1));
  EXPECT_FALSE(a.deallocate_async(p, kS1));  // double free
  EXPECT_EQ(a.counters().failed_deallocations, 3u);
  EXPECT_EQ(a.counters().deallocations, 1u);
  a.pool().check_invariants();
}

TEST_F(StreamOrderedAllocatorTest, ConcurrentStreamsAllocateAndFreeSafely) {
  StreamOrderedAllocator a(make_pool(host_), CachingPool::kMaxAlignment);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&a, t] {
      const Stream s{static_cast<std::uintptr_t>(t + 1)};
      for (int i = 0; i < 500; ++i) {
        void* p = a.allocate_async(static_cast<std::uint64_t>(256 * (1 + (i % 37))), 256, 0, s);
        if (p == nullptr || !a.deallocate_async(p, s)) std::abort();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(a.counters().allocations, 2000u);
  EXPECT_EQ(a.counters().deallocations, 2000u);
  EXPECT_EQ(a.stats().live_bytes, 0u);
  events_.complete_all();
  a.pool().check_invariants();
}

TEST_F(StreamOrderedAllocatorTest, ConstructorRefusesNoPoolAndABadMaxAlignment) {
  EXPECT_THROW(StreamOrderedAllocator(nullptr, 256), InvalidArgument);
  EXPECT_THROW(StreamOrderedAllocator(make_pool(host_), 300), InvalidArgument);
}

}  // namespace
}  // namespace sdalloc::tensorrt
