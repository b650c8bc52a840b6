// weight_offloader_test.cpp - weight offload on the host backend: the budget holds at every
// load (seen by the device resource itself), outputs equal the unoffloaded run, the copies
// overlap simulated compute of known duration, and each error leaves it usable.
#include "sdalloc/transfer/weight_offloader.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/policies/caching_pool.hpp"
#include "sdalloc/resources/host_resource.hpp"
#include "sdalloc/transfer/host_copy_backend.hpp"
#include "support/test_support.hpp"

namespace sdalloc {
namespace {

constexpr std::size_t kKiB = 1024;
constexpr std::size_t kMiB = kKiB * kKiB;
using Clock = std::chrono::steady_clock;

// The "device": host memory whose every allocation is checked against the budget.
class BudgetedDevice final : public MemoryResource {
 public:
  explicit BudgetedDevice(std::size_t budget) : budget_(budget) {}
  std::string name() const override { return "budgeted_device"; }
  std::size_t current() const { return current_; }
  std::size_t peak() const { return peak_; }
  std::size_t violations() const { return violations_; }
  std::size_t allocations() const { return allocations_; }

 private:
  void* do_allocate(std::size_t bytes, Stream stream) override {
    current_ += bytes;
    ++allocations_;
    if (current_ > budget_) ++violations_;
    peak_ = std::max(peak_, current_.load());
    return host_.allocate(bytes, stream);
  }
  void do_deallocate(void* ptr, std::size_t bytes, Stream stream) override {
    current_ -= bytes;
    host_.deallocate(ptr, bytes, stream);
  }
  HostResource host_;
  std::size_t budget_;
  std::atomic<std::size_t> current_{0};
  std::size_t peak_ = 0;
  std::size_t violations_ = 0;
  std::size_t allocations_ = 0;
};

struct Model {
  std::vector<std::vector<float>> weights;  // layer i reads weights[i]
  explicit Model(std::size_t layers, std::size_t floats) {
    for (std::size_t l = 0; l < layers; ++l) {
      std::vector<float> w(floats);
      for (std::size_t j = 0; j < floats; ++j) w[j] = static_cast<float>((l * 7 + j) % 13) * 0.25f;
      weights.push_back(std::move(w));
    }
  }
};

// One layer of the "network": x = 0.5 x + w, read from wherever the weight lives now.
void layer(std::vector<float>& x, const float* w) {
  for (std::size_t j = 0; j < x.size(); ++j) x[j] = 0.5f * x[j] + w[j];
}

TEST(WeightOffloader, OutputsEqualTheUnoffloadedRunAndTheBudgetHoldsAtEveryLoad) {
  const Model model(12, 64 * kKiB / sizeof(float));  // 12 weights of 64 KiB
  std::vector<float> expected(model.weights[0].size(), 1.0f);
  for (int step = 0; step < 4; ++step) {
    for (const auto& w : model.weights) layer(expected, w.data());
  }
  for (const std::size_t budget_weights : {1, 3, 6, 12}) {
    for (const std::size_t prefetch : {0, 1, 3}) {
      const std::size_t budget = budget_weights * 64 * kKiB;
      HostCopyBackend backend;
      TransferEngine engine(backend);
      BudgetedDevice device(budget);
      WeightOffloader offloader(engine, device, OffloadOptions{budget, prefetch, true});
      for (const auto& w : model.weights) {
        offloader.add_weight(w.data(), w.size() * sizeof(float));
      }
      std::vector<float> x(model.weights[0].size(), 1.0f);
      for (int step = 0; step < 4; ++step) {
        offloader.begin_step();
        for (std::size_t l = 0; l < model.weights.size(); ++l) {
          const std::size_t id = l;
          const auto pointers = offloader.acquire(std::span<const std::size_t>(&id, 1));
          EXPECT_NE(pointers[0], static_cast<const void*>(model.weights[l].data()));
          layer(x, static_cast<const float*>(pointers[0]));
        }
        offloader.end_step();
      }
      EXPECT_EQ(x, expected) << "budget " << budget_weights << " prefetch " << prefetch;
      EXPECT_EQ(device.violations(), 0u) << budget_weights << "/" << prefetch;
      EXPECT_LE(device.peak(), budget);
      const OffloadStats stats = offloader.stats();
      EXPECT_LE(stats.peak_resident_bytes, budget);
      EXPECT_EQ(stats.recorded_steps, 1u);
      EXPECT_EQ(stats.planned_steps, 3u);
      EXPECT_EQ(stats.divergent_steps, 0u);
      if (budget_weights == 12) {
        EXPECT_EQ(stats.loads, 12u);  // all fit: loaded once
      }
    }
  }
}

struct StepTime {
  double seconds = 0;
  std::uint64_t loads = 0;  // in the measured step
  std::uint64_t waits = 0;
};

// Wall time of one planned step: `layers` uses, each a sleep of `compute`, weights whose
// copy lasts `copy` (the backend's speed), budget of four weights.
StepTime step_time(std::size_t prefetch, std::chrono::milliseconds compute,
                   std::chrono::milliseconds copy, std::size_t layers) {
  constexpr std::size_t kWeight = 256 * kKiB;
  HostCopyBackendOptions options;
  options.bytes_per_second =
      static_cast<double>(kWeight) / std::chrono::duration<double>(copy).count();
  HostCopyBackend backend(options);
  TransferEngine engine(backend);
  HostResource device;
  WeightOffloader offloader(engine, device, OffloadOptions{4 * kWeight, prefetch, true});
  std::vector<std::vector<unsigned char>> weights(layers, std::vector<unsigned char>(kWeight, 1));
  for (const auto& w : weights) offloader.add_weight(w.data(), w.size());
  StepTime last;
  for (int step = 0; step < 3; ++step) {  // record, plan, then the measured steady step
    const OffloadStats before = offloader.stats();
    const auto start = Clock::now();
    offloader.begin_step();
    for (std::size_t l = 0; l < layers; ++l) {
      (void)offloader.acquire(std::span<const std::size_t>(&l, 1));
      std::this_thread::sleep_for(compute);
    }
    offloader.end_step();
    last.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    last.loads = offloader.stats().loads - before.loads;
    last.waits = offloader.stats().waits - before.waits;
  }
  return last;
}

TEST(WeightOffloader, CopiesOverlapComputeOfKnownDuration) {
  using std::chrono::milliseconds;
  constexpr std::size_t kLayers = 16;
  struct Case {
    milliseconds compute, copy;
  };
  for (const Case c :
       {Case{milliseconds(30), milliseconds(15)}, Case{milliseconds(15), milliseconds(30)}}) {
    const double compute_total = kLayers * std::chrono::duration<double>(c.compute).count();
    const double copy_seconds = std::chrono::duration<double>(c.copy).count();
    // A step whose copies overlap compute takes about max(compute, copy); one that does not,
    // compute + copy (the synchronous step below). The bar is halfway between the two for
    // the loads the step made: it leaves room for the time each acquire and each sleep's
    // overshoot add (about 60 ms a step under TSan on CI's two loaded cores, 1.12 x
    // max(compute, copy) once), and no step without overlap meets it. A loaded machine only
    // ever makes a step slower, so the step is timed up to three times and the fastest counts.
    StepTime overlapped;
    double bound = 0;
    double halfway = 0;
    for (int attempt = 0; attempt < 3; ++attempt) {
      const StepTime t = step_time(2, c.compute, c.copy, kLayers);
      // Total copy time: the loads the step made (weights kept resident cost nothing).
      const double copy_total = static_cast<double>(t.loads) * copy_seconds;
      if (attempt == 0 || t.seconds < overlapped.seconds) {
        overlapped = t;
        bound = std::max(compute_total, copy_total);
        halfway = (bound + compute_total + copy_total) / 2;
      }
      if (overlapped.seconds <= halfway) break;
    }
    const StepTime synchronous = step_time(0, c.compute, c.copy, kLayers);
    const double sum = compute_total + static_cast<double>(synchronous.loads) * copy_seconds;
    std::printf(
        "offload step (compute %lld ms, copy %lld ms per layer, %zu layers): "
        "prefetch 2 %.3f s (%llu loads, %llu waits), max(compute, copy) %.3f s; "
        "synchronous %.3f s (%llu loads), compute + copy %.3f s\n",
        static_cast<long long>(c.compute.count()), static_cast<long long>(c.copy.count()), kLayers,
        overlapped.seconds, static_cast<unsigned long long>(overlapped.loads),
        static_cast<unsigned long long>(overlapped.waits), bound, synchronous.seconds,
        static_cast<unsigned long long>(synchronous.loads), sum);
    EXPECT_LE(overlapped.seconds, halfway);
    EXPECT_GE(synchronous.seconds, 0.97 * sum);
  }
}

TEST(WeightOffloader, BudgetBelowTheLargestWeightIsAnErrorThatSaysSo) {
  HostCopyBackend backend;
  TransferEngine engine(backend);
  HostResource device;
  WeightOffloader offloader(engine, device, OffloadOptions{kMiB, 2, true});
  std::vector<unsigned char> big(2 * kMiB), small(kMiB / 2);
  try {
    offloader.add_weight(big.data(), big.size());
    FAIL() << "a weight larger than the budget was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(test::Contains(e.what(), "largest single weight"));
    EXPECT_TRUE(test::Contains(e.what(), "2097152 B"));
  }
  // A layer reading two weights that fit alone but not together.
  const std::size_t a = offloader.add_weight(small.data(), small.size());
  std::vector<unsigned char> other(kMiB / 2 + 1);
  const std::size_t b = offloader.add_weight(other.data(), other.size());
  offloader.begin_step();
  const std::size_t both[] = {a, b};
  EXPECT_THROW((void)offloader.acquire(both), InvalidArgument);
  EXPECT_EQ(offloader.acquire(std::span<const std::size_t>(&a, 1)).size(), 1u);  // usable
  const std::size_t unknown = 9;
  EXPECT_THROW((void)offloader.acquire(std::span<const std::size_t>(&unknown, 1)), InvalidArgument);
  offloader.end_step();
  EXPECT_THROW((void)offloader.acquire(std::span<const std::size_t>(&a, 1)), InvalidArgument);
  EXPECT_THROW(WeightOffloader(engine, device, OffloadOptions{0, 2, true}), InvalidArgument);
}

TEST(WeightOffloader, FailedLoadIsReportedAndTheNextStepLoadsAgain) {
  std::atomic<int> fail_calls{0};
  HostCopyBackendOptions options;
  options.fail_call = [&](const CopyCall&) { return fail_calls.fetch_sub(1) > 0; };
  HostCopyBackend backend(options);
  TransferEngine engine(backend);
  HostResource device;
  const Model model(4, 1024);
  WeightOffloader offloader(engine, device, OffloadOptions{2 * 4096, 1, true});
  for (const auto& w : model.weights) offloader.add_weight(w.data(), 4096);
  const auto run_step = [&] {
    offloader.begin_step();
    std::vector<float> x(1024, 1.0f);
    for (std::size_t l = 0; l < 4; ++l) {
      layer(x,
            static_cast<const float*>(offloader.acquire(std::span<const std::size_t>(&l, 1))[0]));
    }
    offloader.end_step();
    return x;
  };
  const std::vector<float> good = run_step();
  fail_calls = 1;
  offloader.begin_step();
  bool failed = false;
  for (std::size_t l = 0; l < 4; ++l) {
    try {
      (void)offloader.acquire(std::span<const std::size_t>(&l, 1));
    } catch (const TransferError& e) {
      failed = true;
      EXPECT_TRUE(test::Contains(e.what(), "failed"));
    }
  }
  offloader.end_step();
  EXPECT_TRUE(failed);
  EXPECT_EQ(run_step(), good);  // usable after
  EXPECT_EQ(run_step(), good);
}

TEST(WeightOffloader, StreamOrderedUseServesTheSameWeights) {
  HostCopyBackend backend;
  TransferEngine engine(backend);
  HostResource host;
  CachingPool device(host);  // a stream-ordered pool: evictions free on the compute stream
  const Model model(6, 1024);
  OffloadOptions options{2 * 4096, 2, true};
  options.stream_ordered = true;
  options.compute_stream = Stream(42);
  WeightOffloader offloader(engine, device, options);
  for (const auto& w : model.weights) offloader.add_weight(w.data(), 4096);
  std::vector<float> expected(1024, 1.0f);
  for (int step = 0; step < 3; ++step) {
    for (const auto& w : model.weights) layer(expected, w.data());
  }
  std::vector<float> x(1024, 1.0f);
  for (int step = 0; step < 3; ++step) {
    offloader.begin_step();
    for (std::size_t l = 0; l < model.weights.size(); ++l) {
      layer(x,
            static_cast<const float*>(offloader.acquire(std::span<const std::size_t>(&l, 1))[0]));
    }
    offloader.end_step();
  }
  EXPECT_EQ(x, expected);
  EXPECT_LE(offloader.stats().peak_resident_bytes, 2 * 4096u);
  EXPECT_EQ(offloader.stats().planned_steps, 2u);
}

TEST(WeightOffloader, DivergentStepIsServedOnDemandAndPlannedAgain) {
  HostCopyBackend backend;
  TransferEngine engine(backend);
  BudgetedDevice device(2 * 4096);
  const Model model(5, 1024);
  WeightOffloader offloader(engine, device, OffloadOptions{2 * 4096, 2, true});
  for (const auto& w : model.weights) offloader.add_weight(w.data(), 4096);
  const auto step = [&](const std::vector<std::size_t>& order) {
    offloader.begin_step();
    std::vector<float> x(1024, 1.0f);
    for (const std::size_t l : order) {
      layer(x,
            static_cast<const float*>(offloader.acquire(std::span<const std::size_t>(&l, 1))[0]));
    }
    offloader.end_step();
    return x;
  };
  const std::vector<float> forward = step({0, 1, 2, 3, 4});
  EXPECT_EQ(step({0, 1, 2, 3, 4}), forward);
  const std::vector<float> other = step({4, 3, 0});
  EXPECT_EQ(offloader.stats().divergent_steps, 1u);
  EXPECT_EQ(step({4, 3, 0}), other);  // the new order is planned and followed
  EXPECT_EQ(offloader.stats().planned_steps, 2u);
  EXPECT_EQ(device.violations(), 0u);
}

}  // namespace
}  // namespace sdalloc
