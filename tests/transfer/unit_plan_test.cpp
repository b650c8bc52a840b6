// unit_plan_test.cpp - the unit planner: the layout holds the budget, no two units whose
// lives overlap share bytes, each copy waits for the last unit that used its bytes, the
// units that must stay resident do, the simulation's times, the choice by compute per
// byte, and the errors.
#include "sdalloc/transfer/unit_plan.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "../../bench/transfer/unit_table.hpp"
#include "sdalloc/core/errors.hpp"

namespace sdalloc {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

UnitPlanInput sequence(std::vector<std::size_t> bytes, std::vector<double> compute,
                       std::size_t budget, double speed) {
  UnitPlanInput in;
  in.bytes = std::move(bytes);
  in.compute_seconds = std::move(compute);
  for (std::size_t u = 0; u < in.bytes.size(); ++u) in.order.push_back(u);
  in.budget = budget;
  in.bytes_per_second = speed;
  return in;
}

// The layout's invariants, whatever the plan chose.
void check_layout(const UnitPlanInput& in, const UnitPlan& plan) {
  ASSERT_LE(plan.region_bytes, in.budget);
  EXPECT_EQ(plan.ring_offset, plan.resident_bytes);
  std::size_t streamed_bytes = 0;
  for (std::size_t u = 0; u < in.bytes.size(); ++u) {
    if (plan.streamed[u]) {
      EXPECT_GE(plan.device_offset[u], plan.ring_offset);
      EXPECT_LE(plan.device_offset[u] + in.bytes[u], plan.ring_offset + plan.ring_bytes);
      streamed_bytes += in.bytes[u];
    } else {
      EXPECT_LE(plan.device_offset[u] + in.bytes[u], plan.resident_bytes);
    }
    EXPECT_EQ(plan.device_offset[u] % in.alignment, 0u);
  }
  EXPECT_EQ(streamed_bytes, plan.streamed_bytes);
  // Resident units never share bytes.
  for (std::size_t a = 0; a < in.bytes.size(); ++a) {
    for (std::size_t b = a + 1; b < in.bytes.size(); ++b) {
      if (plan.streamed[a] || plan.streamed[b]) continue;
      const bool apart = plan.device_offset[a] + in.bytes[a] <= plan.device_offset[b] ||
                         plan.device_offset[b] + in.bytes[b] <= plan.device_offset[a];
      EXPECT_TRUE(apart) << a << " and " << b;
    }
  }
  // A streamed unit waits for the nearest earlier unit sharing its bytes; none between.
  const std::size_t n = plan.stream_order.size();
  ASSERT_EQ(plan.wait_back.size(), n);
  for (std::size_t j = 0; j < n; ++j) {
    const std::size_t u = plan.stream_order[j];
    ASSERT_GE(plan.wait_back[j], 1u);
    ASSERT_LE(plan.wait_back[j], n);
    for (std::size_t d = 1; d <= plan.wait_back[j]; ++d) {
      const std::size_t v = plan.stream_order[(j + n - d) % n];
      const bool overlap = plan.device_offset[u] < plan.device_offset[v] + in.bytes[v] &&
                           plan.device_offset[v] < plan.device_offset[u] + in.bytes[u];
      EXPECT_EQ(overlap, d == plan.wait_back[j]) << "position " << j << " back " << d;
    }
  }
}

TEST(UnitPlan, AModelInsideTheBudgetStaysResident) {
  const UnitPlanInput in = sequence({kMiB, 2 * kMiB, kMiB}, {1e-3, 2e-3, 1e-3}, 8 * kMiB, 1e9);
  const UnitPlan plan = plan_units(in);
  EXPECT_TRUE(plan.stream_order.empty());
  EXPECT_EQ(plan.ring_bytes, 0u);
  EXPECT_EQ(plan.streamed_bytes, 0u);
  EXPECT_DOUBLE_EQ(plan.predicted_step_seconds, 4e-3);
  EXPECT_DOUBLE_EQ(plan.floor_seconds, 4e-3);
  check_layout(in, plan);
}

TEST(UnitPlan, LayoutsHoldTheBudgetAndSlotsNeverCollide) {
  std::mt19937 rng(47);
  for (int trial = 0; trial < 60; ++trial) {
    std::uniform_int_distribution<std::size_t> units(2, 40), size(1, 64);
    std::uniform_real_distribution<double> time(0, 2e-3);
    const std::size_t n = units(rng);
    UnitPlanInput in;
    std::size_t total = 0, largest = 0;
    for (std::size_t u = 0; u < n; ++u) {
      in.bytes.push_back(size(rng) * 4096 + 100);
      in.compute_seconds.push_back(time(rng));
      in.host_seconds.push_back(time(rng) / 2);
      total += in.bytes.back();
      largest = std::max(largest, in.bytes.back());
    }
    for (std::size_t u = 0; u < n; ++u) in.order.push_back(u);
    std::shuffle(in.order.begin(), in.order.end(), rng);
    in.budget = std::max(2 * largest + 4096, total / (2 + trial % 3));
    in.bytes_per_second = 1e9;
    in.seconds_per_copy = 5e-6;
    const UnitPlan plan = plan_units(in);
    check_layout(in, plan);
    EXPECT_GE(plan.predicted_step_seconds, plan.floor_seconds * (1 - 1e-9));
    EXPECT_GE(plan.floor_seconds, plan.ideal_floor_seconds * (1 - 1e-9));
  }
}

TEST(UnitPlan, UnitsUsedTwiceUnusedOrKeptStayResident) {
  UnitPlanInput in =
      sequence(std::vector<std::size_t>(6, 4 * kMiB), std::vector<double>(6, 1e-3), 16 * kMiB, 1e9);
  in.order = {0, 1, 0, 2, 5};            // 0 twice, 3 and 4 never
  const UnitPlan plan = plan_units(in);  // 0, 3, 4 kept (12 MiB): a ring of 4 MiB
  check_layout(in, plan);
  EXPECT_FALSE(plan.streamed[0]);
  EXPECT_FALSE(plan.streamed[3]);
  EXPECT_FALSE(plan.streamed[4]);
  EXPECT_EQ(plan.stream_order, (std::vector<std::size_t>{1, 2, 5}));
  in.keep_resident = {false, true, false, false, false, false};
  in.budget = 20 * kMiB;  // 16 MiB kept, a ring for the others
  const UnitPlan kept = plan_units(in);
  check_layout(in, kept);
  EXPECT_EQ(kept.stream_order, (std::vector<std::size_t>{2, 5}));
  in.budget = 19 * kMiB;  // no room for a ring
  try {
    (void)plan_units(in);
    FAIL() << "a budget below the kept units was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("cannot hold the units kept resident"), std::string::npos)
        << e.what();
  }
}

TEST(UnitPlan, ABudgetBelowTheLargestUnitIsRefusedWithBothSizes) {
  const UnitPlanInput in = sequence({kMiB, 3 * kMiB}, {1e-3, 1e-3}, 2 * kMiB, 1e9);
  try {
    (void)plan_units(in);
    FAIL() << "accepted";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("the budget 2097152 B"), std::string::npos) << what;
    EXPECT_NE(what.find("largest unit's 3145728 B"), std::string::npos) << what;
  }
}

TEST(UnitPlan, BadInputIsRefused) {
  UnitPlanInput in = sequence({kMiB, kMiB}, {1e-3}, 4 * kMiB, 1e9);
  EXPECT_THROW((void)plan_units(in), InvalidArgument);  // one time for two units
  in = sequence({kMiB, kMiB}, {1e-3, 1e-3}, 4 * kMiB, 0);
  EXPECT_THROW((void)plan_units(in), InvalidArgument);  // no speed
  in = sequence({kMiB, kMiB}, {1e-3, 1e-3}, 4 * kMiB, 1e9);
  in.order.push_back(7);
  EXPECT_THROW((void)plan_units(in), InvalidArgument);  // an unknown unit
  in = sequence({kMiB, 0}, {1e-3, 1e-3}, 4 * kMiB, 1e9);
  EXPECT_THROW((void)plan_units(in), InvalidArgument);  // an empty unit
}

// Two streamed units in a ring that holds one: each copy waits for the other's compute.
TEST(UnitPlan, TheSimulationSerialisesWhatTheRingCannotOverlap) {
  UnitPlanInput in = sequence({kMiB, kMiB}, {10e-3, 10e-3}, kMiB, kMiB / 5e-3);
  UnitPlan plan;
  plan.streamed = {true, true};
  plan.device_offset = {0, 0};
  plan.stream_order = {0, 1};
  plan.wait_back = {1, 1};
  plan.ring_bytes = kMiB;
  // copy 5 ms, compute 10 ms: 1 can load only once 0 is released (at 1's call), so each
  // step is copy + compute twice = 30 ms... and the first copy of a step waits for the
  // last unit's release at the step's end.
  EXPECT_NEAR(simulate_unit_plan(in, plan), 30e-3, 1e-9);
  // A ring for both: copies overlap compute; the step is the compute, 20 ms.
  plan.device_offset = {0, kMiB};
  plan.wait_back = {2, 2};
  plan.ring_bytes = 2 * kMiB;
  EXPECT_NEAR(simulate_unit_plan(in, plan), 20e-3, 1e-9);
  // Copy-bound (copy 20 ms each): the engine never idles, 40 ms.
  in.bytes_per_second = kMiB / 20e-3;
  EXPECT_NEAR(simulate_unit_plan(in, plan), 40e-3, 1e-9);
}

// A launch-bound step: the host's 10 ms per unit hides a device wait for a copy.
TEST(UnitPlan, ALaunchBoundHostHidesACopyTheDeviceCatchesUpOn) {
  UnitPlanInput in = sequence({kMiB, kMiB, kMiB}, {2e-3, 2e-3, 2e-3}, 2 * kMiB, kMiB / 8e-3);
  in.host_seconds = {10e-3, 10e-3, 10e-3};
  const UnitPlan plan = plan_units(in);
  check_layout(in, plan);
  EXPECT_NEAR(plan.compute_seconds, 30e-3, 1e-9);
  EXPECT_NEAR(plan.predicted_step_seconds, 30e-3, 1e-9) << plan.describe();
}

// Streaming the units with much compute per byte hides their copies; the others stay.
TEST(UnitPlan, StreamsTheUnitsWithMostComputePerByte) {
  // Four light units (8 MiB, 1 ms) and four heavy ones (2 MiB, 8 ms), interleaved; room for
  // the light ones and a ring of two heavy ones.
  UnitPlanInput in;
  for (int i = 0; i < 4; ++i) {
    in.bytes.push_back(8 * kMiB);
    in.compute_seconds.push_back(1e-3);
    in.bytes.push_back(2 * kMiB);
    in.compute_seconds.push_back(8e-3);
  }
  for (std::size_t u = 0; u < in.bytes.size(); ++u) in.order.push_back(u);
  in.budget = 36 * kMiB;
  in.bytes_per_second = kMiB / 1e-3;  // a heavy unit copies in 2 ms, a light one in 8
  const UnitPlan plan = plan_units(in);
  check_layout(in, plan);
  for (std::size_t u = 0; u < in.bytes.size(); ++u) {
    EXPECT_EQ(plan.streamed[u], u % 2 == 1) << plan.describe();
  }
  EXPECT_NEAR(plan.predicted_step_seconds, plan.compute_seconds, 1e-9);
}

// The SD UNet's units at a T well above the copies: the plan reaches T.
TEST(UnitPlan, TheSdUnetAboveItsCopyTimeReachesT) {
  const auto rows = bench::read_unit_table(SDALLOC_SOURCE_DIR "/bench/transfer/sd_unet_units.csv");
  const auto work = bench::unit_work(rows, 65e-3, 0.6, 1.0);
  UnitPlanInput in;
  std::size_t total = 0;
  for (const auto& w : work) {
    in.bytes.push_back(w.bytes);
    in.compute_seconds.push_back(w.device_seconds);
    in.host_seconds.push_back(w.host_seconds);
    in.keep_resident.push_back(w.keep_resident);
    total += w.bytes;
  }
  for (std::size_t u = 0; u < work.size(); ++u) in.order.push_back(u);
  in.bytes_per_second = 55e9;
  for (const double share : {0.5, 0.25}) {
    in.budget = static_cast<std::size_t>(share * static_cast<double>(total));
    const UnitPlan plan = plan_units(in);
    check_layout(in, plan);
    EXPECT_LE(plan.predicted_step_seconds, 1.01 * plan.ideal_floor_seconds) << plan.describe();
  }
}

}  // namespace
}  // namespace sdalloc
