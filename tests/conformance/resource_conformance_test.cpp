// resource_conformance_test.cpp - what every MemoryResource must do, for every configuration.
//
// One typed suite over AllConfigurations (resource_configurations.hpp): alignment, usable
// and disjoint memory, zero-byte requests, random mixed-size sequences against the reference
// model, several threads at once, cross-stream frees, hand-off between threads, and the
// huge-request and exhausted-capacity failures. The error paths that need pointer checks
// (double free, foreign pointers, wrong sizes, bad alignments) are in
// resource_error_conformance_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "conformance/random_sequence.hpp"
#include "conformance/reference_model.hpp"
#include "conformance/resource_configurations.hpp"
#include "sdalloc/core/errors.hpp"

namespace sdalloc::conformance {
namespace {

constexpr int kThreads = 4;

template <typename Config>
class ResourceConformance : public ::testing::Test {
 public:  // run_concurrent_sequences drives the fixture from outside
  MemoryResource& resource() { return config_.resource(); }
  ReferenceModel new_model(unsigned seed = 0) const {
    return ReferenceModel(Config::kGuaranteedAlignment, seed);
  }

  void expect_accounting(const ReferenceModel& model) {
    config_.expect_accounting(model);
    EXPECT_TRUE(model.check_all_patterns());
  }

  ::testing::AssertionResult free_all(ReferenceModel& model) {
    while (!model.empty()) {
      auto [ptr, entry] = *model.live().begin();
      auto intact = model.remove(reinterpret_cast<void*>(ptr));
      if (!intact) return intact;
      resource().deallocate(reinterpret_cast<void*>(ptr), entry.size, entry.stream);
    }
    return ::testing::AssertionSuccess();
  }

  // Builds one model out of per-thread models, failing if two threads hold overlapping
  // memory.
  ::testing::AssertionResult merge(const std::vector<ReferenceModel>& models,
                                   ReferenceModel& merged) const {
    for (const ReferenceModel& model : models) {
      for (const auto& [address, entry] : model.live()) {
        auto adopted = merged.adopt(address, entry);
        if (!adopted) return adopted;
      }
    }
    return ::testing::AssertionSuccess();
  }

  Config config_;
};

TYPED_TEST_SUITE(ResourceConformance, AllConfigurations, ConfigurationName);

// ---- alignment, usable memory, zero bytes ---------------------------------------------------

// Which bytes ResultsAreAlignedWritableAndDisjoint fills and checks: `span` bytes at the
// start of every `step`. All of them, except for large allocations in sanitizer builds:
// page faults are slow on CI machines and slower under the sanitizers' shadow memory, so
// there a span per MiB is written (the plain build checks every byte).
struct FillPlan {
  std::size_t step;
  std::size_t span;
};

FillPlan fill_plan(std::size_t size) {
  constexpr std::size_t kPage = HostResource::kPageSize;
  return size <= kWholeFillLimit ? FillPlan{kPage, kPage} : FillPlan{kMiB, kPatternSpan};
}

TYPED_TEST(ResourceConformance, ResultsAreAlignedWritableAndDisjoint) {
  static_assert(TypeParam::kGuaranteedAlignment >= kMinAlignment);
  const std::size_t sizes[] = {1,        255,          256,          257,      511,   512,
                               513,      4095,         4096,         4097,     65535, kMiB + 1,
                               2 * kMiB, 2 * kMiB + 1, 5 * kMiB + 3, 64 * kMiB};
  ReferenceModel model = this->new_model();
  for (const std::size_t size : sizes) {
    void* ptr = this->resource().allocate(size);
    ASSERT_TRUE(model.add(ptr, size)) << "size " << size;
    // The whole range must be writable, not only the bytes the model patterns.
    const unsigned char pattern = model.live().at(reinterpret_cast<std::uintptr_t>(ptr)).pattern;
    const FillPlan plan = fill_plan(size);
    auto* bytes = static_cast<unsigned char*>(ptr);
    for (std::size_t offset = 0; offset < size; offset += plan.step) {
      std::memset(bytes + offset, pattern, std::min(plan.span, size - offset));
    }
  }
  // Every filled byte of every allocation still holds its own pattern once all are live.
  std::vector<unsigned char> expected(HostResource::kPageSize);
  for (const auto& [address, entry] : model.live()) {
    std::memset(expected.data(), entry.pattern, expected.size());
    const auto* bytes = reinterpret_cast<const unsigned char*>(address);
    const FillPlan plan = fill_plan(entry.size);
    for (std::size_t offset = 0; offset < entry.size; offset += plan.step) {
      const std::size_t length = std::min(plan.span, entry.size - offset);
      if (std::memcmp(bytes + offset, expected.data(), length) != 0) {
        ADD_FAILURE() << "allocation of " << entry.size << " bytes lost its pattern in [" << offset
                      << ", " << offset + length << ")";
        break;
      }
    }
  }
  this->expect_accounting(model);
  ASSERT_TRUE(this->free_all(model));
  this->expect_accounting(model);
}

TYPED_TEST(ResourceConformance, ZeroBytesReturnsNullAndReservesNothing) {
  EXPECT_EQ(this->resource().allocate(0), nullptr);
  EXPECT_EQ(this->resource().allocate(0, Stream{3}), nullptr);
  EXPECT_NO_THROW(this->resource().deallocate(nullptr, 0));
  EXPECT_NO_THROW(this->resource().deallocate(nullptr, 0, Stream{3}));
  this->expect_accounting(this->new_model());
  if constexpr (TypeParam::kIsPool) {
    auto& pool = this->config_.pool();
    EXPECT_NO_THROW(pool.free(nullptr));
    EXPECT_NO_THROW(pool.free(nullptr, Stream{3}));
    EXPECT_EQ(pool.allocate(0, 4096, Stream{}), nullptr);
    const PoolStats s = pool.stats();
    EXPECT_EQ(s.allocations, 0u) << "zero-byte requests are not counted";
    EXPECT_EQ(s.frees, 0u);
    EXPECT_EQ(s.reserved_bytes, initial_reservation_of(pool))
        << "zero-byte requests reserve nothing";
  }
}

// ---- random sequences -----------------------------------------------------------------------

TYPED_TEST(ResourceConformance, RandomMixedSizesMatchTheReferenceModel) {
  ReferenceModel model = this->new_model();
  std::mt19937_64 rng(20240601);
  SequenceShape shape;
  shape.operations = scaled_operations<TypeParam>(3000);
  auto checkpoint = [&] { this->expect_accounting(model); };
  EXPECT_TRUE(run_random_sequence(this->resource(), model, rng, shape, checkpoint));
}

TYPED_TEST(ResourceConformance, RandomMixedSizesOnSeveralStreamsMatchTheReferenceModel) {
  ReferenceModel model = this->new_model();
  std::mt19937_64 rng(777);
  SequenceShape shape;
  shape.operations = scaled_operations<TypeParam>(3000);
  shape.streams = {Stream{0}, Stream{1}, Stream{2}, Stream{3}};
  // Freeing on any stream is allowed: the caller promises the memory is reusable there.
  shape.free_on_any_stream = true;
  auto checkpoint = [&] { this->expect_accounting(model); };
  EXPECT_TRUE(run_random_sequence(this->resource(), model, rng, shape, checkpoint));
}

TYPED_TEST(ResourceConformance, ManySmallAllocationsMatchTheReferenceModel) {
  // Small tensors only: many blocks per segment, so splitting and merging dominate.
  ReferenceModel model = this->new_model();
  std::mt19937_64 rng(99);
  SequenceShape shape;
  shape.operations = scaled_operations<TypeParam>(4000);
  shape.max_size = 64 * kKiB;
  shape.max_live = 512;
  auto checkpoint = [&] { this->expect_accounting(model); };
  EXPECT_TRUE(run_random_sequence(this->resource(), model, rng, shape, checkpoint));
}

// ---- threads --------------------------------------------------------------------------------

// Each thread runs its own sequence and stops with its allocations still live; the test then
// checks them all together (no overlap between threads, accounting), and the threads free
// everything at once.
template <typename Config>
void run_concurrent_sequences(ResourceConformance<Config>& test, bool distinct_streams) {
  std::vector<ReferenceModel> models;
  for (int t = 0; t < kThreads; ++t)
    models.push_back(test.new_model(static_cast<unsigned>(t * 61)));
  std::vector<::testing::AssertionResult> results(kThreads, ::testing::AssertionSuccess());

  auto run_phase = [&](bool free_everything) {
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        std::mt19937_64 rng(static_cast<std::uint64_t>(1000 + t) + (free_everything ? 7 : 0));
        SequenceShape shape;
        shape.operations = free_everything ? 0 : scaled_operations<Config>(800);
        shape.live_budget = 128 * kMiB;
        shape.max_live = 64;
        shape.streams = {distinct_streams ? Stream{static_cast<std::uintptr_t>(t + 1)}
                                          : kDefaultStream};
        shape.free_everything_at_end = free_everything;
        results[static_cast<std::size_t>(t)] =
            run_random_sequence(test.resource(), models[static_cast<std::size_t>(t)], rng, shape);
      });
    }
    for (std::thread& thread : threads) thread.join();
    for (int t = 0; t < kThreads; ++t) {
      EXPECT_TRUE(results[static_cast<std::size_t>(t)]) << "thread " << t;
    }
  };

  run_phase(/*free_everything=*/false);
  ReferenceModel merged = test.new_model();
  ASSERT_TRUE(test.merge(models, merged));
  EXPECT_GT(merged.totals().count, 0u);
  test.expect_accounting(merged);

  run_phase(/*free_everything=*/true);
  test.expect_accounting(test.new_model());
}

TYPED_TEST(ResourceConformance, ConcurrentThreadsOnOneStreamStayConsistent) {
  run_concurrent_sequences(*this, /*distinct_streams=*/false);
}

TYPED_TEST(ResourceConformance, ConcurrentThreadsOnDistinctStreamsStayConsistent) {
  run_concurrent_sequences(*this, /*distinct_streams=*/true);
}

// A minimal blocking queue for handing allocations from one thread to another.
struct HandedOver {
  void* ptr = nullptr;
  std::size_t size = 0;
  unsigned char pattern = 0;
};

class HandOffQueue {
 public:
  void push(HandedOver item) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      items_.push_back(item);
    }
    ready_.notify_one();
  }
  HandedOver pop() {
    std::unique_lock<std::mutex> lock(mutex_);
    ready_.wait(lock, [&] { return !items_.empty(); });
    HandedOver item = items_.front();
    items_.pop_front();
    return item;
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<HandedOver> items_;
};

TYPED_TEST(ResourceConformance, AllocationHandedToAnotherThreadIsFreedThere) {
  const int items = scaled_operations<TypeParam>(400);
  HandOffQueue queue;
  ::testing::AssertionResult producer_result = ::testing::AssertionSuccess();
  ::testing::AssertionResult consumer_result = ::testing::AssertionSuccess();

  std::thread producer([&] {
    std::mt19937_64 rng(5);
    LogUniformSize size_of(4 * kMiB);
    for (int i = 0; i < items; ++i) {
      const std::size_t size = size_of(rng);
      void* ptr = this->resource().allocate(size, Stream{1});
      if (ptr == nullptr || reinterpret_cast<std::uintptr_t>(ptr) % kMinAlignment != 0) {
        producer_result = ::testing::AssertionFailure() << "bad result " << ptr;
        queue.push({});  // unblocks the consumer
        return;
      }
      const auto pattern = static_cast<unsigned char>(1 + i % 250);
      write_pattern(ptr, size, pattern);
      queue.push({ptr, size, pattern});
    }
    queue.push({});
  });
  std::thread consumer([&] {
    for (int i = 0;; ++i) {
      HandedOver item = queue.pop();
      if (item.ptr == nullptr) return;
      auto intact = pattern_intact(item.ptr, item.size, item.pattern);
      if (!intact && consumer_result) consumer_result = intact;
      // Alternate between the allocating stream and another one.
      this->resource().deallocate(item.ptr, item.size, Stream{i % 2 == 0 ? 1u : 2u});
    }
  });
  producer.join();
  consumer.join();
  EXPECT_TRUE(producer_result);
  EXPECT_TRUE(consumer_result);
  this->expect_accounting(this->new_model());
}

// ---- streams --------------------------------------------------------------------------------

TYPED_TEST(ResourceConformance, FreeOnAnotherStreamLeavesMemoryReusableOnBoth) {
  for (const std::size_t size : {std::size_t{1000}, kMiB, 3 * kMiB + 5}) {
    SCOPED_TRACE("size " + std::to_string(size));
    ReferenceModel model = this->new_model();
    void* first = this->resource().allocate(size, Stream{1});
    ASSERT_TRUE(model.add(first, size, Stream{1}));
    ASSERT_TRUE(model.remove(first));
    this->resource().deallocate(first, size, Stream{2});
    this->expect_accounting(model);

    [[maybe_unused]] std::uint64_t segments_before = 0;
    if constexpr (TypeParam::kIsPool) {
      segments_before = this->config_.pool().stats().segment_allocations;
    }
    // Host streams complete at once, so the memory is reusable on both streams, without
    // asking the resource below for more.
    for (const Stream stream : {Stream{2}, Stream{1}, Stream{2}}) {
      void* again = this->resource().allocate(size, stream);
      ASSERT_TRUE(model.add(again, size, stream));
      this->expect_accounting(model);
      ASSERT_TRUE(model.remove(again));
      this->resource().deallocate(again, size, stream);
    }
    if constexpr (TypeParam::kIsPool) {
      EXPECT_EQ(this->config_.pool().stats().segment_allocations, segments_before)
          << "a block freed on another stream must be reused (host events complete at "
             "once), not replaced by a new segment";
    }
    this->expect_accounting(model);
  }
}

// ---- failures -------------------------------------------------------------------------------

TYPED_TEST(ResourceConformance, HugeRequestsThrowOutOfMemoryAndChangeNothing) {
  ReferenceModel model = this->new_model();
  void* held = this->resource().allocate(10000);
  ASSERT_TRUE(model.add(held, 10000));

  const std::size_t huge_sizes[] = {SIZE_MAX, SIZE_MAX - 4095, SIZE_MAX / 2 + 1,
                                    std::size_t{1} << 62, CachingPool::kMaxAllocation + 1};
  for (const std::size_t size : huge_sizes) {
    SCOPED_TRACE("size " + std::to_string(size));
    [[maybe_unused]] PoolStats before;
    if constexpr (TypeParam::kIsPool) before = this->config_.pool().stats();
    try {
      void* ptr = this->resource().allocate(size);
      ADD_FAILURE() << "allocate(" << size << ") returned " << ptr;
      this->resource().deallocate(ptr, size);
    } catch (const OutOfMemory& e) {
      EXPECT_EQ(e.info.requested, size) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "expected OutOfMemory, got: " << e.what();
    }
    if constexpr (TypeParam::kIsPool) {
      const PoolStats after = this->config_.pool().stats();
      EXPECT_EQ(after.allocations, before.allocations);
      EXPECT_EQ(after.live_bytes, before.live_bytes);
      EXPECT_EQ(after.live_allocations, before.live_allocations);
      EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
      EXPECT_EQ(after.ooms, before.ooms + 1) << "ooms counts every OutOfMemory thrown";
    }
    this->expect_accounting(model);
  }
  if constexpr (TypeParam::kIsPool) {
    // Alignment rounding must not wrap a size near SIZE_MAX into a small one.
    EXPECT_THROW(
        this->config_.pool().allocate(SIZE_MAX - 100, CachingPool::kMaxAlignment, Stream{}),
        OutOfMemory);
    this->expect_accounting(model);
  }
  ASSERT_TRUE(this->free_all(model));
  // Still works after the failures.
  void* ptr = this->resource().allocate(3 * kMiB);
  ASSERT_TRUE(model.add(ptr, 3 * kMiB));
  ASSERT_TRUE(this->free_all(model));
  this->expect_accounting(model);
}

TYPED_TEST(ResourceConformance, ReportsItsCapacity) {
  EXPECT_EQ(this->resource().capacity(), TypeParam::kCapacity);
  EXPECT_FALSE(this->resource().name().empty());
}

TYPED_TEST(ResourceConformance, ExhaustingCapacityThrowsOutOfMemoryAndRecovers) {
  if constexpr (TypeParam::kCapacity == 0) {
    GTEST_SKIP() << "no capacity to exhaust";
  } else {
    constexpr std::size_t kChunk = kGiB;
    constexpr std::size_t kFits = TypeParam::kCapacity / kChunk;
    ReferenceModel model = this->new_model();
    for (int round = 0; round < 2; ++round) {
      SCOPED_TRACE("round " + std::to_string(round));
      std::size_t granted = 0;
      for (;;) {
        void* ptr = nullptr;
        try {
          ptr = this->resource().allocate(kChunk);
        } catch (const OutOfMemory& e) {
          const std::string message = e.what();
          EXPECT_EQ(e.info.requested, kChunk) << message;
          EXPECT_EQ(e.info.capacity, TypeParam::kCapacity) << message;
          EXPECT_NE(message.find("capacity"), std::string::npos) << message;
          if constexpr (TypeParam::kIsPool) {
            const PoolStats s = this->config_.pool().stats();
            EXPECT_NE(message.find("live"), std::string::npos) << message;
            EXPECT_NE(message.find("reserved"), std::string::npos) << message;
            EXPECT_NE(message.find("largest free"), std::string::npos) << message;
            EXPECT_EQ(e.info.live, s.live_bytes) << message;
            EXPECT_EQ(e.info.reserved, s.reserved_bytes) << message;
            EXPECT_EQ(s.ooms, static_cast<std::uint64_t>(round + 1));
          }
          break;
        }
        ASSERT_TRUE(model.add(ptr, kChunk));
        ASSERT_LE(++granted, kFits) << "more than the capacity was handed out";
      }
      EXPECT_EQ(granted, kFits) << "whole chunks that fit the capacity must be granted";
      this->expect_accounting(model);
      ASSERT_TRUE(this->free_all(model));
      this->expect_accounting(model);
    }
  }
}

}  // namespace
}  // namespace sdalloc::conformance
