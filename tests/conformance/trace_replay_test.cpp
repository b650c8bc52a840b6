// trace_replay_test.cpp - the acceptance bars, on the bundled real Stable Diffusion trace.
//
// data/traces/sd15_unet_b2_64x64_cpu_2pass.csv is two passes of an SD 1.5 UNet at batch 2,
// 64x64 latents: 3214 allocations from 4 bytes to 1 GiB, 53 GB allocated in total, peak live
// 2262839808 bytes. Replayed through a default CachingPool over host memory:
//  - the pool's peak live bytes equal the trace's (it counts requests exactly);
//  - its peak reserved bytes stay within 10% of the peak live bytes (the lead's pool is
//    expected near 1.01; PyTorch's allocator needs more on this trace);
//  - the same replay fits a card of 1.15 x the peak live bytes (LimitResource).
// The memory is never touched: host segments are mmap'd and stay virtual, so replaying 53 GB
// of allocations costs only the pool's own work.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "conformance/resource_configurations.hpp"
#include "conformance/trace_replay.hpp"
#include "sdalloc/core/errors.hpp"
#include "sdalloc/policies/caching_pool.hpp"
#include "sdalloc/resources/host_resource.hpp"
#include "sdalloc/resources/limit_resource.hpp"
#include "sdalloc/resources/stats_resource.hpp"
#include "sdalloc/trace/event_trace.hpp"

namespace sdalloc::conformance {
namespace {

constexpr std::uint64_t kTracePeakLiveBytes = 2262839808;
constexpr double kMaxPeakOverhead = 1.10;
constexpr double kCardHeadroom = 1.15;
// PyTorch's caching allocator holds 1.20-2.23 x live on these sequences (`sdalloc replay -a
// torch-native`); the segment cache stays below it.
constexpr double kMaxShapeChangeOverhead = 1.70;

const EventTrace& sd15_trace() {
  static const EventTrace trace =
      read_event_trace(SDALLOC_DATA_DIR "/traces/sd15_unet_b2_64x64_cpu_2pass.csv");
  return trace;
}

TEST(TraceReplay, BundledTraceHasTheKnownPeak) {
  const EventTrace& trace = sd15_trace();
  EXPECT_EQ(trace.events.size(), 6428u);
  EXPECT_EQ(trace.allocation_count(), 3214u);
  EXPECT_EQ(trace.peak_live_bytes(), kTracePeakLiveBytes);
}

TEST(TraceReplay, PeakReservedStaysWithinTenPercentOfPeakLive) {
  HostResource host;
  CachingPool pool(host);
  ASSERT_TRUE(replay(sd15_trace(), pool));
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.peak_live_bytes, kTracePeakLiveBytes);
  EXPECT_EQ(s.live_bytes, 0u);
  EXPECT_EQ(s.allocations, 3214u);
  const double ratio =
      static_cast<double>(s.peak_reserved_bytes) / static_cast<double>(s.peak_live_bytes);
  RecordProperty("peak_reserved_bytes", std::to_string(s.peak_reserved_bytes));
  RecordProperty("peak_overhead_ratio", std::to_string(ratio));
  EXPECT_LE(ratio, kMaxPeakOverhead) << "peak reserved " << format_bytes(s.peak_reserved_bytes)
                                     << " for peak live " << format_bytes(s.peak_live_bytes);
  EXPECT_DOUBLE_EQ(s.peak_overhead_ratio(), ratio);
  EXPECT_NO_THROW(pool.check_invariants());
}

TEST(TraceReplay, FitsACardOfOnePointOneFiveTimesPeakLive) {
  const auto capacity =
      static_cast<std::size_t>(kCardHeadroom * static_cast<double>(kTracePeakLiveBytes));
  HostResource host;
  LimitResource card(host, capacity);
  CachingPool pool(card);
  EXPECT_TRUE(replay(sd15_trace(), pool)) << "on a card of " << format_bytes(capacity);
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.peak_live_bytes, kTracePeakLiveBytes);
  EXPECT_LE(s.peak_reserved_bytes, capacity);
  EXPECT_EQ(s.ooms, 0u);
  EXPECT_NO_THROW(pool.check_invariants());
  expect_limit_matches(card, s.reserved_bytes);
}

// Traces of other shapes than the one the policy was first tuned on. Their large
// activations are 8-128 MiB (attention slices, SDXL, smaller latents): with the old
// 128 MiB huge threshold they were cut up for small tensors and the pool held 1.32-1.70 x
// live; with 8 MiB they keep segments of their own and three passes stay within 1.10 x.
// After the first pass (where the pool consolidates) the third makes no segment call.
TEST(TraceReplay, TracesOfOtherShapesStayWithinTenPercentAndTheThirdPassMakesNoCall) {
  for (const char* name : {"sd15_unet_b2_64x64_sliced_cpu_2pass.csv",
                           "sdxl_unet_b2_64x64_sliced_cpu.csv", "sd21_unet_b2_64x64_sliced_cpu.csv",
                           "rec_sdunet_b1_40x40.csv", "rec_sdunet_b2_24x24.csv"}) {
    SCOPED_TRACE(name);
    const EventTrace trace = read_event_trace(std::string(SDALLOC_DATA_DIR "/traces/") + name);
    HostResource host;
    CachingPool pool(host);
    ASSERT_TRUE(replay(trace, pool));
    ASSERT_TRUE(replay(trace, pool));
    const PoolStats before = pool.stats();
    ASSERT_TRUE(replay(trace, pool));
    const PoolStats s = pool.stats();
    EXPECT_EQ(s.segment_allocations, before.segment_allocations);
    EXPECT_EQ(s.segment_releases, before.segment_releases);
    const double ratio =
        static_cast<double>(s.peak_reserved_bytes) / static_cast<double>(trace.peak_live_bytes());
    EXPECT_LE(ratio, kMaxPeakOverhead);
  }
}

TEST(TraceReplay, TheOldHugeThresholdHoldsMoreOnTheSlicedTrace) {
  const EventTrace trace =
      read_event_trace(SDALLOC_DATA_DIR "/traces/sd15_unet_b2_64x64_sliced_cpu_2pass.csv");
  HostResource host;
  CachingPool pool(host, CachingPoolOptions{.huge_threshold = std::size_t{128} << 20});
  ASSERT_TRUE(replay(trace, pool));
  EXPECT_GT(static_cast<double>(pool.stats().peak_reserved_bytes) /
                static_cast<double>(trace.peak_live_bytes()),
            kMaxPeakOverhead);
}

// Shape changes (a higher resolution, the VAE decoder after the UNet, and back): each repeat
// of the sequence churns where the shape changes, and the stream consolidates at its end
// (it empties); from the third repeat on the sequence runs in the arena.
TEST(TraceReplay, ShapeChangesSettleByTheThirdRepeat) {
  for (const char* name :
       {"seq_ascending_b1_16_b2_24_b2_32.csv.gz", "seq_alternating_b2_24_b2_32_x2.csv.gz",
        "seq_descending_b2_32_b2_24_b1_16.csv.gz", "seq_unet_b2_32_then_vae_b1_16.csv.gz"}) {
    SCOPED_TRACE(name);
    const EventTrace trace = read_event_trace(std::string(SDALLOC_DATA_DIR "/traces/") + name);
    HostResource host;
    CachingPool pool(host);
    for (int pass = 0; pass < 2; ++pass) ASSERT_TRUE(replay(trace, pool));
    const PoolStats before = pool.stats();
    ASSERT_TRUE(replay(trace, pool));
    const PoolStats s = pool.stats();
    EXPECT_EQ(s.segment_allocations, before.segment_allocations);
    EXPECT_EQ(s.segment_releases, before.segment_releases);
    EXPECT_LE(
        static_cast<double>(s.peak_reserved_bytes) / static_cast<double>(trace.peak_live_bytes()),
        kMaxShapeChangeOverhead);
    EXPECT_NO_THROW(pool.check_invariants());
  }
}

// A model's weights: tensors of `sizes` in turn, at least `at_least` bytes in all, live until
// free_all (never touched). A 1 KiB first tensor matters: a model's first parameter is often
// a bias, and the slack of its segment once marked the stream fragmented and pinned its low
// at zero, so consolidation around weights never came.
struct Weights {
  Weights(CachingPool& pool, std::size_t at_least, std::span<const std::size_t> sizes) {
    for (std::size_t i = 0; bytes < at_least; ++i) {
      blocks.push_back(pool.allocate(sizes[i % sizes.size()]));
      bytes += sizes[i % sizes.size()];
    }
  }
  void free_all(CachingPool& pool) {
    for (void* block : blocks) pool.free(block);
    blocks.clear();
  }
  std::vector<void*> blocks;
  std::size_t bytes = 0;
};
constexpr std::size_t kBiasThenThreeTensors[] = {1024, std::size_t{2} << 20, std::size_t{2} << 20,
                                                 std::size_t{2} << 20};

// `first` replays of the trace, then `more`; `before` gets the stats between them.
bool replay_then_measure(const EventTrace& trace, CachingPool& pool, int first, int more,
                         PoolStats* before) {
  for (int i = 0; i < first; ++i) {
    if (!replay(trace, pool)) return false;
  }
  *before = pool.stats();
  for (int i = 0; i < more; ++i) {
    if (!replay(trace, pool)) return false;
  }
  return true;
}

// A model's weights are allocated before its first step and live through every step, so
// the stream never empties. The pool consolidates around them once the work has come back to
// the floor they make after two equal steps (caching_pool.hpp, "Consolidation"): from the
// fourth step on the steps make no segment call, where without consolidation every step
// releases segments and takes them again.
TEST(TraceReplay, WeightsThatStayLiveDoNotStopConsolidation) {
  for (const char* name :
       {"rec_vae_b1_16x16.csv", "rec_sdunet_b2_32x32.csv", "sdxl_unet_b2_64x64_sliced_cpu.csv"}) {
    SCOPED_TRACE(name);
    const EventTrace trace = read_event_trace(std::string(SDALLOC_DATA_DIR "/traces/") + name);
    for (const bool consolidate : {true, false}) {
      SCOPED_TRACE(consolidate ? "consolidating" : "not consolidating");
      HostResource host;
      CachingPool pool(host, CachingPoolOptions{.consolidate_when_empty = consolidate});
      // Weights of 3 x the step's peak (the order 2, 2, 2 MiB, 1 KiB hid the zero low).
      Weights weights(pool, 3 * trace.peak_live_bytes(), kBiasThenThreeTensors);
      // The first step churns; the next two show the step repeats; the fourth begins in the
      // arena.
      PoolStats before;
      ASSERT_TRUE(replay_then_measure(trace, pool, 4, 2, &before));
      const PoolStats s = pool.stats();
      EXPECT_EQ(s.live_bytes, weights.bytes);
      const double ratio =
          static_cast<double>(s.peak_reserved_bytes) / static_cast<double>(s.peak_live_bytes);
      const std::uint64_t taken = s.segment_allocations - before.segment_allocations;
      const std::uint64_t released = s.segment_releases - before.segment_releases;
      if (consolidate) {
        EXPECT_GE(s.consolidations, 1u);
        EXPECT_EQ(taken, 0u);
        EXPECT_EQ(released, 0u);
        EXPECT_LE(ratio, 1.16);
      } else {
        EXPECT_GT(taken, 50u) << "no churn to remove: the test shows nothing";
        EXPECT_GT(released, 50u);
      }
      weights.free_all(pool);
      EXPECT_NO_THROW(pool.check_invariants());
    }
  }
}

// The same with the trace recorded on an H200 under its fp16 UNet's 1.72 GB of weights: 64x64
// steps, then 96x96. Every step released and took segments again (on the GPU, 2720
// cudaMalloc+cudaFree in 20 steps) before consolidation around weights; now a repeat of the
// trace takes segments only where the shape changes (the 96x96 attention buffers, 2.5 GiB
// each, which the 64x64 arena cannot hold). What it holds is the first 64x64 arena, pinned by
// blocks that outlive the shape change, beside the 96x96 one (docs/pools.md).
TEST(TraceReplay, WeightsOnMemoryAsAGpusConsolidateAtTheirFloor) {
  const EventTrace trace =
      read_event_trace(SDALLOC_DATA_DIR "/traces/gpu_sdunet_fp16_b2_64_96.csv.gz");
  HostResource host;
  CachingPool pool(host);
  Weights weights(pool, 1719041928, kBiasThenThreeTensors);
  PoolStats before;
  ASSERT_TRUE(replay_then_measure(trace, pool, 1, 1, &before));
  const PoolStats s = pool.stats();
  EXPECT_GE(s.consolidations, 1u);
  // Per repeat of the trace (ten steps, two shapes): one 512 MiB buffer at 64x64 and two
  // of 2.5 GiB at 96x96 are taken again; the old rule took some 600 segments.
  EXPECT_LE(s.segment_allocations - before.segment_allocations, 8u);
  EXPECT_LE(static_cast<double>(s.peak_reserved_bytes) / static_cast<double>(s.peak_live_bytes),
            1.45);
  weights.free_all(pool);
  EXPECT_NO_THROW(pool.check_invariants());
}

// Small work under weights: ResNet-18 (10 MiB live) under 0.5 GB of tensors of SD 1.5's
// UNet parameter sizes (scripts/trace_tools.py weights). The work lives mostly in the free
// tails of the weights' segments and churns between segments of its own, only one of them
// free at its floor: consolidation needed two, and every step took and released segments
// (679 taken and 639 released in four steps). Now the one range becomes an arena, and later
// steps take no segment.
TEST(TraceReplay, SmallWorkUnderWeightsConsolidatesAroundOneFreeSegment) {
  const EventTrace trace = read_event_trace(SDALLOC_DATA_DIR "/traces/rec_tv_resnet18_b1_224.csv");
  constexpr std::size_t kUnetParameterSizes[] = {
      320 * 4,           320 * 320 * 9 * 4, 640 * 4,        640 * 640 * 4,     1280 * 1280 * 9 * 4,
      320 * 768 * 4,     1280 * 4,          1280 * 768 * 4, 640 * 320 * 9 * 4, 2560 * 4,
      640 * 640 * 9 * 4, 1280 * 1280 * 4,   640 * 768 * 4,  320 * 320 * 4};
  HostResource host;
  CachingPool pool(host);
  Weights weights(pool, 500'000'000, kUnetParameterSizes);
  PoolStats before;
  ASSERT_TRUE(replay_then_measure(trace, pool, 2, 2, &before));
  const PoolStats s = pool.stats();
  EXPECT_GE(s.consolidations, 1u);
  EXPECT_EQ(s.segment_allocations, before.segment_allocations);
  EXPECT_EQ(s.segment_releases, before.segment_releases);
  weights.free_all(pool);
  EXPECT_NO_THROW(pool.check_invariants());
}

// A UNet trace whose work comes back to a floor of 81 MiB twice inside a pass (of a 145 MiB
// peak, before a later peak of 153 MiB): the pool consolidates there, as at the end of a
// repeated step, and again when the later peak outgrew that arena. Whatever the shape of
// the pass, the third pass runs in what the first two left, and the pool holds less than
// PyTorch's caching allocator (1.92 x live, `sdalloc replay -a torch-native`).
TEST(TraceReplay, AFloorInsideAPassStillSettlesByTheThirdPass) {
  const EventTrace trace = read_event_trace(SDALLOC_DATA_DIR "/traces/rec_sdunet_b2_32x32.csv");
  HostResource host;
  CachingPool pool(host);
  for (int pass = 0; pass < 2; ++pass) ASSERT_TRUE(replay(trace, pool));
  const std::uint64_t taken = pool.stats().segment_allocations;
  ASSERT_TRUE(replay(trace, pool));
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.segment_allocations, taken) << "the third pass runs in what it has";
  EXPECT_LE(
      static_cast<double>(s.peak_reserved_bytes) / static_cast<double>(trace.peak_live_bytes()),
      1.70);
}

// stats() reads: a caller polling it (as PyTorch users poll memory_stats() every step) does
// not change what the pool does. It used to merge the parked blocks of the quick lists to
// report the largest free block, which moved later blocks: ResNet-50's trace held 1.160 x
// live with a stats() call after every event and 1.114 x without.
TEST(TraceReplay, PollingStatsChangesNothingThePoolDoes) {
  const EventTrace trace =
      read_event_trace(SDALLOC_DATA_DIR "/traces/torchvision_resnet50_b1_224_cpu_2pass.csv");
  HostResource host;
  StatsResource polled_upstream(host);
  StatsResource quiet_upstream(host);
  CachingPool polled(polled_upstream);
  CachingPool quiet(quiet_upstream);
  std::size_t largest_seen = 0;
  for (int pass = 0; pass < 3; ++pass) {
    ASSERT_TRUE(replay(trace, polled, [&] {
      largest_seen = std::max(largest_seen, polled.stats().largest_free_block);
    }));
    ASSERT_TRUE(replay(trace, quiet));
  }
  EXPECT_GT(largest_seen, 0u);
  const PoolStats a = polled.stats();
  const PoolStats b = quiet.stats();
  EXPECT_EQ(a.peak_reserved_bytes, b.peak_reserved_bytes);
  EXPECT_EQ(a.segment_allocations, b.segment_allocations);
  EXPECT_EQ(a.segment_releases, b.segment_releases);
  EXPECT_EQ(a.consolidations, b.consolidations);
  EXPECT_EQ(polled_upstream.stats().allocations, quiet_upstream.stats().allocations);
}

}  // namespace
}  // namespace sdalloc::conformance
