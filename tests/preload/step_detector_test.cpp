// step_detector_test.cpp - StepDetector: locks onto a repeated step after loading, begins
// steps at the same place each time, never locks on a sequence that does not repeat, and
// unlocks after a run of divergent steps.
#include "preload/step_detector.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <random>
#include <vector>

namespace sdalloc::preload {
namespace {

using Action = StepDetector::Action;
constexpr std::size_t kMiB = std::size_t{1} << 20;

// A UNet-like step: activations pile up (skip connections), then are freed as they are used.
struct Loop {
  StepDetector detector;
  std::vector<Action> actions;  // one per allocation
  std::size_t live = 0;

  void allocate(std::size_t bytes) {
    actions.push_back(detector.on_allocate(bytes));
    ++live;
  }
  void free(std::size_t count = 1) {
    for (std::size_t i = 0; i < count; ++i) detector.on_free();
    live -= count;
  }
  void load_weights(std::size_t count) {
    for (std::size_t i = 0; i < count; ++i) allocate((i % 7 + 1) * kMiB);
  }
  void step() {
    for (std::size_t block = 0; block < 4; ++block) {
      allocate((8 >> block) * kMiB);
      allocate((8 >> block) * kMiB + 4096);
      free();  // a temporary
    }
    for (std::size_t block = 0; block < 4; ++block) {
      allocate(3 * kMiB);
      free(2);  // the block's output and one skip connection
    }
  }
};

TEST(StepDetector, LocksOntoTheRepeatedStepAfterLoading) {
  Loop loop;
  loop.load_weights(300);
  std::size_t begins = 0;
  std::size_t end_begins = 0;
  std::size_t first_begin_step = 0;
  for (std::size_t s = 0; s < 40; ++s) {
    const std::size_t before = loop.actions.size();
    loop.step();
    for (std::size_t i = before; i < loop.actions.size(); ++i) {
      if (loop.actions[i] == Action::kBegin) {
        ++begins;
        first_begin_step = s;
        EXPECT_EQ(i, before) << "steps must begin where the loop's step begins";
      }
      if (loop.actions[i] == Action::kEndAndBegin) {
        ++end_begins;
        EXPECT_EQ(i, before);
      }
    }
  }
  EXPECT_TRUE(loop.detector.locked());
  EXPECT_EQ(loop.detector.step_allocations(), 12u);
  EXPECT_EQ(begins, 1u);
  EXPECT_LE(first_begin_step, 30u);
  EXPECT_EQ(end_begins, 39u - first_begin_step);
  for (std::size_t i = 0; i < 300; ++i) EXPECT_EQ(loop.actions[i], Action::kNone);
}

TEST(StepDetector, NeverLocksOnRequestsThatDoNotRepeat) {
  Loop loop;
  std::mt19937 rng(7);
  for (int i = 0; i < 20000; ++i) {
    loop.allocate((1 + rng() % 64) * kMiB);
    if (loop.live > 4 && rng() % 2 == 0) loop.free(1 + rng() % 3);
  }
  EXPECT_FALSE(loop.detector.locked());
  for (Action a : loop.actions) EXPECT_EQ(a, Action::kNone);
}

TEST(StepDetector, UnlocksAfterARunOfDivergentSteps) {
  Loop loop;
  loop.load_weights(10);
  for (int s = 0; s < 40; ++s) loop.step();
  ASSERT_TRUE(loop.detector.locked());
  for (std::size_t i = 1; i < StepDetector::kMaxDivergentRun; ++i) {
    EXPECT_EQ(loop.detector.step_ended(true), Action::kNone);
  }
  EXPECT_EQ(loop.detector.step_ended(false), Action::kNone);  // a good step resets the run
  for (std::size_t i = 1; i < StepDetector::kMaxDivergentRun; ++i) loop.detector.step_ended(true);
  EXPECT_EQ(loop.detector.step_ended(true), Action::kEnd);
  EXPECT_FALSE(loop.detector.locked());
  for (int s = 0; s < 40; ++s) loop.step();
  EXPECT_TRUE(loop.detector.locked()) << "it learns again";
  EXPECT_EQ(loop.detector.locks(), 2u);
}

// What detection costs per large request before it locks (docs/preload.md quotes it).
TEST(StepDetector, LearningCostsLittlePerRequest) {
  Loop loop;
  std::mt19937 rng(3);
  constexpr int kRequests = 200000;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kRequests; ++i) {
    loop.detector.on_allocate((1 + rng() % 64) * kMiB);
    if (rng() % 2 == 0) loop.detector.on_free();
  }
  const double ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() /
      kRequests;
  RecordProperty("ns_per_request", static_cast<int>(ns));
  std::printf("step detection while learning: %.1f ns per large request\n", ns);
  EXPECT_LT(ns, 2000.0);
}

}  // namespace
}  // namespace sdalloc::preload
