// CapacityCap: the running total under a limit behind LimitResource (whose cap the PyTorch
// shim changes while in use). Grants up to the limit and no further, refuses without changing
// anything, follows a changed limit, and never lets concurrent callers pass it together.
#include "sdalloc/resources/capacity_cap.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <thread>
#include <vector>

namespace sdalloc {
namespace {

TEST(CapacityCapTest, GrantsUpToTheLimitExactly) {
  CapacityCap cap(100);
  const CapacityCap::Reservation first = cap.try_reserve(60);
  EXPECT_TRUE(first);
  EXPECT_EQ(first.used, 60u);
  EXPECT_EQ(first.limit, 100u);
  EXPECT_TRUE(cap.try_reserve(40));
  EXPECT_EQ(cap.used(), 100u);
}

TEST(CapacityCapTest, RefusalChangesNothingAndSaysWhatStoodInTheWay) {
  CapacityCap cap(100);
  ASSERT_TRUE(cap.try_reserve(70));
  const CapacityCap::Reservation refused = cap.try_reserve(31);
  EXPECT_FALSE(refused);
  EXPECT_FALSE(refused.granted);
  EXPECT_EQ(refused.used, 70u);
  EXPECT_EQ(refused.limit, 100u);
  EXPECT_EQ(cap.used(), 70u);
}

TEST(CapacityCapTest, ZeroLimitRefusesEveryByte) {
  CapacityCap cap(0);
  EXPECT_FALSE(cap.try_reserve(1));
  EXPECT_TRUE(cap.try_reserve(0));  // nothing asked, nothing refused
  EXPECT_EQ(cap.used(), 0u);
}

TEST(CapacityCapTest, ReleaseMakesRoomAgain) {
  CapacityCap cap(100);
  ASSERT_TRUE(cap.try_reserve(100));
  EXPECT_FALSE(cap.try_reserve(1));
  cap.release(30);
  EXPECT_EQ(cap.used(), 70u);
  EXPECT_TRUE(cap.try_reserve(30));
}

TEST(CapacityCapTest, LoweringTheLimitBelowUseRefusesUntilEnoughIsReleased) {
  CapacityCap cap(100);
  ASSERT_TRUE(cap.try_reserve(80));
  cap.set_limit(50);
  EXPECT_EQ(cap.limit(), 50u);
  EXPECT_EQ(cap.used(), 80u);  // nothing is taken back
  const CapacityCap::Reservation refused = cap.try_reserve(1);
  EXPECT_FALSE(refused);
  EXPECT_EQ(refused.limit, 50u);
  cap.release(40);
  EXPECT_TRUE(cap.try_reserve(10));
  EXPECT_FALSE(cap.try_reserve(1));
}

TEST(CapacityCapTest, RaisingTheLimitGrantsMore) {
  CapacityCap cap(10);
  ASSERT_TRUE(cap.try_reserve(10));
  cap.set_limit(20);
  EXPECT_TRUE(cap.try_reserve(10));
}

TEST(CapacityCapTest, NoLimitRefusesOnlyOverflow) {
  CapacityCap cap(CapacityCap::kNoLimit);
  EXPECT_TRUE(cap.try_reserve(std::size_t{1} << 62));
  EXPECT_TRUE(cap.try_reserve(std::size_t{1} << 62));
  EXPECT_FALSE(cap.try_reserve(CapacityCap::kNoLimit));
  EXPECT_EQ(cap.used(), std::size_t{1} << 63);
}

TEST(CapacityCapTest, ConcurrentReservationsNeverPassTheLimit) {
  constexpr std::size_t kLimit = 1000;
  constexpr int kThreads = 8;
  constexpr int kTries = 5000;
  CapacityCap cap(kLimit);
  std::atomic<bool> passed{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kTries; ++i) {
        if (!cap.try_reserve(7)) continue;
        if (cap.used() > kLimit) passed = true;
        cap.release(7);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_FALSE(passed.load());
  EXPECT_EQ(cap.used(), 0u);
}

TEST(CapacityCapTest, ConcurrentReservationsFillTheLimitExactly) {
  constexpr int kThreads = 8;
  CapacityCap cap(100);
  std::atomic<int> granted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) granted += cap.try_reserve(1) ? 1 : 0;
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(granted.load(), 100);
  EXPECT_EQ(cap.used(), 100u);
}

}  // namespace
}  // namespace sdalloc
