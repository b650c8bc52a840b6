// unit_offloader_test.cpp - the unit offloader on the simulated device: every kernel reads
// its own unit's bytes (checked on the device's thread when it runs), the budget holds,
// one copy call per streamed unit per step, no allocation, host wait or different call
// after the plan, the fallback without page-locking, and the errors.
#include "sdalloc/transfer/unit_offloader.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <random>
#include <thread>

#include "../../bench/transfer/unit_table.hpp"
#include "sdalloc/core/errors.hpp"

namespace sdalloc {
namespace {

constexpr std::size_t kKiB = 1024;

struct Model {
  std::vector<bench::UnitWork> work;
  std::size_t bytes = 0;
};

// `n` units of 64..448 KiB, 0.3 ms of device time each, launched in 2 kernels.
Model small_model(std::size_t n, unsigned seed = 3) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::size_t> size(1, 7);
  Model m;
  for (std::size_t u = 0; u < n; ++u) {
    bench::UnitWork w;
    w.bytes = size(rng) * 64 * kKiB;
    w.kernels = 2;
    w.host_seconds = 0.1e-3;
    w.device_seconds = 0.3e-3;
    m.work.push_back(w);
    m.bytes += w.bytes;
  }
  return m;
}

struct Rig {
  explicit Rig(const Model& model, std::size_t budget, SimulatedDeviceOptions device_options = {},
               UnitOffloadOptions options = {})
      : device(device_options), offloader(device, with_budget(options, budget)) {
    for (const auto& w : model.work) offloader.add_unit(w.bytes, w.keep_resident);
    offloader.seal();
    for (std::size_t u = 0; u < model.work.size(); ++u) {
      bench::fill_image(offloader.host_image(u), u, model.work[u].bytes);
    }
  }
  static UnitOffloadOptions with_budget(UnitOffloadOptions o, std::size_t budget) {
    o.budget = budget;
    return o;
  }
  void step(const Model& model) { bench::run_step(device, &offloader, model.work, {}, 0, bad); }
  SimulatedDevice device;
  UnitOffloader offloader;
  std::atomic<std::uint64_t> bad{0};
};

SimulatedDeviceOptions a_gpu() {
  SimulatedDeviceOptions o;
  o.copy_bytes_per_second = 2e9;
  o.seconds_per_copy = 10e-6;
  o.seconds_per_call = 2e-6;
  return o;
}

TEST(UnitOffloader, EveryKernelReadsItsUnitAndTheSteadyStateIsEventsOnly) {
  const Model model = small_model(24);
  Rig rig(model, model.bytes * 2 / 5, a_gpu());
  for (int step = 0; step < 2; ++step) rig.step(model);  // recorded, then the first planned
  ASSERT_TRUE(rig.offloader.planned());
  const UnitPlan& plan = rig.offloader.plan();
  ASSERT_GT(plan.streamed_units(), 0u) << plan.describe();
  EXPECT_LE(plan.region_bytes, model.bytes * 2 / 5);
  const SimulatedDeviceCounters before = rig.device.counters();
  const UnitOffloadStats stats_before = rig.offloader.stats();
  constexpr int kSteps = 4;
  for (int step = 0; step < kSteps; ++step) rig.step(model);
  const SimulatedDeviceCounters after = rig.device.counters();
  const UnitOffloadStats stats = rig.offloader.stats();
  EXPECT_EQ(rig.bad.load(), 0u);
  EXPECT_EQ(stats.planned_steps, 5u);
  EXPECT_EQ(stats.divergent_steps, 0u);
  // One copy call per streamed unit per step, from page-locked memory only.
  EXPECT_EQ(after.copy_calls - before.copy_calls, kSteps * plan.streamed_units());
  EXPECT_EQ(after.copied_bytes - before.copied_bytes, kSteps * plan.streamed_bytes);
  EXPECT_EQ(after.pageable_copies, 0u);
  // No allocation after the second step; the only host waits are the steps' own ends.
  EXPECT_EQ(after.device_allocations, 1u);
  EXPECT_EQ(after.device_allocations, before.device_allocations);
  EXPECT_EQ(after.host_waits - before.host_waits, static_cast<std::uint64_t>(kSteps));
  EXPECT_EQ(stats.host_waits, stats_before.host_waits);
  EXPECT_EQ(stats.device_allocations, 1u);
  EXPECT_FALSE(stats.registration_refused);
}

TEST(UnitOffloader, SteadyStepsMakeTheSameCallsWithTheSameAddresses) {
  const Model model = small_model(16);
  Rig rig(model, model.bytes / 2, a_gpu());
  for (int step = 0; step < 3; ++step) rig.step(model);
  rig.device.log_calls(true);
  rig.step(model);
  const std::vector<std::string> first = rig.device.take_log();
  rig.step(model);
  const std::vector<std::string> second = rig.device.take_log();
  ASSERT_FALSE(first.empty());
  EXPECT_EQ(first, second);  // what a captured graph would replay
  std::size_t copies = 0;
  for (const auto& call : first) copies += call.rfind("copy ", 0) == 0 ? 1 : 0;
  EXPECT_EQ(copies, rig.offloader.plan().streamed_units());
}

// The checks the other tests rely on can fail: copies into one slot with no event between
// them and the kernels that read it are caught. The compute queue is gated until every copy
// has run, so the race is lost every time, whatever the machine's load or scheduling.
TEST(UnitOffloader, TheKernelChecksCatchCopiesNotOrderedWithTheirReaders) {
  const Model model = small_model(6);
  SimulatedDevice device(a_gpu());
  std::atomic<std::uint64_t> bad{0};
  std::atomic<bool> copies_done{false};
  device.launch(0, 1e-3, [&] {
    while (!copies_done.load()) std::this_thread::yield();
  });
  std::vector<std::unique_ptr<std::byte[]>> hosts;
  std::vector<std::byte*> images;
  std::size_t largest = 0;
  for (std::size_t u = 0; u < model.work.size(); ++u)
    largest = std::max(largest, model.work[u].bytes);
  auto* slot = static_cast<std::byte*>(device.device_memory().allocate(largest));
  auto* pinned = static_cast<std::byte*>(device.allocate_pinned(model.bytes));
  std::size_t at = 0;
  for (std::size_t u = 0; u < model.work.size(); ++u) {
    bench::fill_image(pinned + at, u, model.work[u].bytes);
    device.copy_to_device(slot, pinned + at, model.work[u].bytes);  // no wait: a race
    for (std::size_t k = 0; k < model.work[u].kernels; ++k) {
      const std::size_t bytes = model.work[u].bytes;
      device.launch(0, 1e-3, [&, u, bytes] {
        if (!bench::image_is(slot, u, bytes, 0)) ++bad;
      });
    }
    at += model.work[u].bytes;
  }
  device.synchronize(DeviceQueue::kCopy);
  copies_done = true;
  device.synchronize(DeviceQueue::kCompute);
  // Every unit but the last reads the last one's bytes, in both of its kernels.
  EXPECT_EQ(bad.load(), 2u * (model.work.size() - 1));
  device.free_pinned(pinned, model.bytes);
  device.device_memory().deallocate(slot, largest);
}

TEST(UnitOffloader, ADivergentStepIsServedOnDemandThenRecordedAndPlannedAgain) {
  Model model = small_model(12);
  Rig rig(model, model.bytes / 2, a_gpu());
  for (int step = 0; step < 3; ++step) rig.step(model);
  const std::uint64_t version = rig.offloader.layout_version();
  // Another order: units 3 and 7 swapped.
  Model swapped = model;
  std::vector<std::size_t> order(model.work.size());
  for (std::size_t u = 0; u < order.size(); ++u) order[u] = u;
  std::swap(order[3], order[7]);
  rig.offloader.begin_step(rig.device.compute_stream());
  for (const std::size_t u : order) {
    rig.offloader.enter(u);
    const auto* image = static_cast<const std::byte*>(rig.offloader.device_image(u));
    const std::size_t bytes = model.work[u].bytes;
    rig.device.launch(0, 0.2e-3, [&, u, image, bytes] {
      if (!bench::image_is(image, u, bytes, 0)) ++rig.bad;
    });
  }
  rig.offloader.end_step();
  rig.device.synchronize(DeviceQueue::kCompute);
  EXPECT_EQ(rig.bad.load(), 0u);
  EXPECT_EQ(rig.offloader.stats().divergent_steps, 1u);
  EXPECT_FALSE(rig.offloader.planned());  // the next step is recorded
  EXPECT_GT(rig.offloader.layout_version(), version);
  for (int step = 0; step < 3; ++step) rig.step(model);
  EXPECT_EQ(rig.bad.load(), 0u);
  EXPECT_TRUE(rig.offloader.planned());
  EXPECT_EQ(rig.offloader.stats().recorded_steps, 2u);
  EXPECT_EQ(rig.offloader.stats().plans, 2u);
}

TEST(UnitOffloader, RecordNextStepRecordsAndPlansAgain) {
  const Model model = small_model(10);
  Rig rig(model, model.bytes / 2, a_gpu());
  for (int step = 0; step < 3; ++step) rig.step(model);
  const std::uint64_t version = rig.offloader.layout_version();
  rig.offloader.record_next_step();
  EXPECT_FALSE(rig.offloader.planned());
  EXPECT_GT(rig.offloader.layout_version(), version);
  for (int step = 0; step < 3; ++step) rig.step(model);
  EXPECT_EQ(rig.bad.load(), 0u);
  EXPECT_TRUE(rig.offloader.planned());
  EXPECT_EQ(rig.offloader.stats().recorded_steps, 2u);
  EXPECT_EQ(rig.offloader.stats().divergent_steps, 0u);
  rig.offloader.begin_step(rig.device.compute_stream());
  EXPECT_THROW(rig.offloader.record_next_step(), InvalidArgument);  // inside a step
  rig.offloader.end_step();
}

TEST(UnitOffloader, AStepMissingUnitsDivergesToo) {
  const Model model = small_model(10);
  Rig rig(model, model.bytes / 2, a_gpu());
  for (int step = 0; step < 2; ++step) rig.step(model);
  rig.offloader.begin_step(rig.device.compute_stream());
  rig.offloader.enter(0);
  rig.offloader.end_step();
  EXPECT_EQ(rig.offloader.stats().divergent_steps, 1u);
  for (int step = 0; step < 3; ++step) rig.step(model);
  EXPECT_EQ(rig.bad.load(), 0u);
  EXPECT_TRUE(rig.offloader.planned());
}

TEST(UnitOffloader, HostComputeReadsTheRightBytesAfterEachEnter) {
  const Model model = small_model(10);
  SimulatedDeviceOptions o = a_gpu();
  o.host_compute = true;
  Rig rig(model, model.bytes / 3, o);
  for (int step = 0; step < 4; ++step) {
    rig.offloader.begin_step(rig.device.compute_stream());
    for (std::size_t u = 0; u < model.work.size(); ++u) {
      rig.offloader.enter(u);
      EXPECT_TRUE(bench::image_is(static_cast<const std::byte*>(rig.offloader.device_image(u)), u,
                                  model.work[u].bytes, 0))
          << "step " << step << " unit " << u;
    }
    rig.offloader.end_step();
  }
  EXPECT_EQ(rig.offloader.stats().planned_steps, 3u);
}

TEST(UnitOffloader, AForwardOnAnotherStreamIsRefusedNamingBoth) {
  const Model model = small_model(4);
  Rig rig(model, model.bytes, a_gpu());
  try {
    rig.offloader.begin_step(Stream(0x99));
    FAIL() << "accepted";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("stream 0x99"), std::string::npos) << what;
    EXPECT_NE(what.find("before stream 0x1"), std::string::npos) << what;
  }
  rig.step(model);  // nothing was left half done
  EXPECT_EQ(rig.bad.load(), 0u);
}

TEST(UnitOffloader, ABudgetBelowTheLargestUnitIsRefusedAtAddUnit) {
  SimulatedDevice device;
  UnitOffloadOptions o;
  o.budget = 100 * kKiB;
  UnitOffloader offloader(device, o);
  (void)offloader.add_unit(64 * kKiB);
  try {
    (void)offloader.add_unit(128 * kKiB);
    FAIL() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("budget must hold the largest unit"), std::string::npos);
  }
  EXPECT_THROW(UnitOffloader(device, UnitOffloadOptions{}), InvalidArgument);  // budget 0
}

TEST(UnitOffloader, CallsOutOfOrderAreRefused) {
  SimulatedDevice device;
  UnitOffloadOptions o;
  o.budget = kKiB * kKiB;
  UnitOffloader offloader(device, o);
  EXPECT_THROW(offloader.seal(), InvalidArgument);  // no units
  EXPECT_THROW(offloader.begin_step(device.compute_stream()), InvalidArgument);
  (void)offloader.add_unit(kKiB);
  offloader.seal();
  EXPECT_THROW((void)offloader.add_unit(kKiB), InvalidArgument);
  EXPECT_THROW(offloader.enter(0), InvalidArgument);  // outside a step
  EXPECT_THROW(offloader.end_step(), InvalidArgument);
  offloader.begin_step(device.compute_stream());
  EXPECT_THROW(offloader.enter(5), InvalidArgument);  // unknown unit
}

TEST(UnitOffloader, WithoutPageLockingEveryCopyIsStagedNeverPageable) {
  const Model model = small_model(12);
  UnitOffloadOptions o;
  o.pin = false;
  o.staging_chunk_bytes = 96 * kKiB;  // units span several chunks
  Rig rig(model, model.bytes / 2, a_gpu(), o);
  for (int step = 0; step < 5; ++step) rig.step(model);
  const UnitOffloadStats stats = rig.offloader.stats();
  EXPECT_EQ(rig.bad.load(), 0u);
  EXPECT_TRUE(stats.registration_refused);
  EXPECT_GT(stats.staged_copies, 0u);
  EXPECT_EQ(rig.device.counters().pageable_copies, 0u);
  EXPECT_EQ(stats.planned_steps, 4u);
}

}  // namespace
}  // namespace sdalloc
