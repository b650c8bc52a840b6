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
#include "sdalloc/resources/segments_only_resource.hpp"
#include "sdalloc/resources/stats_resource.hpp"
#include "sdalloc/trace/event_trace.hpp"

namespace sdalloc::conformance {
namespace {

constexpr std::uint64_t kTracePeakLiveBytes = 2262839808;
constexpr double kMaxPeakOverhead = 1.10;
constexpr double kCardHeadroom = 1.15;

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

// Issue 16: traces of other shapes than the one the policy was first tuned on. Their large
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
  // Without the free ends' cut, which alone brings this trace to 1.028 x live even at the
  // old threshold (docs/caching_pool.md, "Free ends").
  CachingPool pool(
      host, CachingPoolOptions{.huge_threshold = std::size_t{128} << 20, .cut_free_ends = false});
  ASSERT_TRUE(replay(trace, pool));
  EXPECT_GT(static_cast<double>(pool.stats().peak_reserved_bytes) /
                static_cast<double>(trace.peak_live_bytes()),
            kMaxPeakOverhead);
}

// Shape changes upward (a higher resolution, the VAE decoder after the UNet): the arena the
// first shape consolidated into is too small for the next, and a segment taken beside it
// stayed apart from it for good (1.55 x live on the ascending sequence). The arena grows in
// place instead (host memory: CachingPoolOptions::grow_arena), and three passes stay within
// 1.10 x; without it the ascending sequence does not.
TEST(TraceReplay, ShapeChangesGrowTheArenaAndStayWithinTenPercent) {
  for (const char* name :
       {"seq_ascending_b1_16_b2_24_b2_32.csv.gz", "seq_alternating_b2_24_b2_32_x2.csv.gz",
        "seq_descending_b2_32_b2_24_b1_16.csv.gz", "seq_unet_b2_32_then_vae_b1_16.csv.gz"}) {
    SCOPED_TRACE(name);
    const EventTrace trace = read_event_trace(std::string(SDALLOC_DATA_DIR "/traces/") + name);
    HostResource host;
    CachingPool pool(host);
    for (int pass = 0; pass < 3; ++pass) ASSERT_TRUE(replay(trace, pool));
    const PoolStats s = pool.stats();
    EXPECT_LE(
        static_cast<double>(s.peak_reserved_bytes) / static_cast<double>(trace.peak_live_bytes()),
        kMaxPeakOverhead);
    EXPECT_NO_THROW(pool.check_invariants());
  }
  const EventTrace trace =
      read_event_trace(SDALLOC_DATA_DIR "/traces/seq_ascending_b1_16_b2_24_b2_32.csv.gz");
  HostResource host;
  CachingPool pool(host, CachingPoolOptions{.grow_arena = false});
  ASSERT_TRUE(replay(trace, pool));
  EXPECT_GT(static_cast<double>(pool.stats().peak_reserved_bytes) /
                static_cast<double>(trace.peak_live_bytes()),
            1.3);
  EXPECT_EQ(pool.stats().arena_growths, 0u);
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
// the stream never empties and consolidation at emptiness never comes. The pool then
// consolidates around them when, after churning again, it comes back to the floor they make
// (CachingPool's note_low): from the third step on the steps make no segment call, where
// without consolidation every step releases segments and takes them again.
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
      PoolStats before;
      ASSERT_TRUE(replay_then_measure(trace, pool, 2, 2, &before));
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
        EXPECT_LE(ratio, 1.10);
      } else {
        EXPECT_GT(taken, 50u) << "no churn to remove: the test shows nothing";
        EXPECT_GT(released, 50u);
      }
      weights.free_all(pool);
      EXPECT_NO_THROW(pool.check_invariants());
    }
  }
}

// The same on memory as a GPU's (SegmentsOnlyResource: no coalesce, split or growth), with
// the trace recorded on an H200 under its fp16 UNet's 1.72 GB of weights: 64x64 steps, then
// 96x96. Before the fix above every step released and took segments again (on the GPU,
// 2720 cudaMalloc+cudaFree in 20 steps); now the stream consolidates at its floor, and a
// repeat of the trace takes segments only where the shape changes (the 96x96 attention
// buffers, 2.5 GiB each, which the 64x64 arena cannot hold).
TEST(TraceReplay, WeightsOnMemoryAsAGpusConsolidateAtTheirFloor) {
  const EventTrace trace =
      read_event_trace(SDALLOC_DATA_DIR "/traces/gpu_sdunet_fp16_b2_64_96.csv.gz");
  HostResource host;
  SegmentsOnlyResource device_like(host);
  CachingPool pool(device_like);
  Weights weights(pool, 1719041928, kBiasThenThreeTensors);
  PoolStats before;
  ASSERT_TRUE(replay_then_measure(trace, pool, 1, 1, &before));
  const PoolStats s = pool.stats();
  EXPECT_GE(s.consolidations, 1u);
  // Per repeat of the trace (ten steps, two shapes): one 512 MiB buffer at 64x64 and two
  // of 2.5 GiB at 96x96 are taken again; the old rule took some 600 segments.
  EXPECT_LE(s.segment_allocations - before.segment_allocations, 8u);
  EXPECT_LE(static_cast<double>(s.peak_reserved_bytes) / static_cast<double>(s.peak_live_bytes),
            1.15);
  weights.free_all(pool);
  EXPECT_NO_THROW(pool.check_invariants());
}

// Small work under weights: ResNet-18 (10 MiB live) under 0.5 GB of tensors of SD 1.5's
// UNet parameter sizes (scripts/trace_tools.py weights). The work lives mostly in the free
// tails of the weights' segments and churns between segments of its own, only one of them
// free at its floor: consolidation needed two, and every step took and released segments
// (as on a GPU, 679 taken and 639 released in four steps). Now the one range becomes an
// arena, on host memory and as on a GPU, and later steps take no segment.
TEST(TraceReplay, SmallWorkUnderWeightsConsolidatesAroundOneFreeSegment) {
  const EventTrace trace = read_event_trace(SDALLOC_DATA_DIR "/traces/rec_tv_resnet18_b1_224.csv");
  constexpr std::size_t kUnetParameterSizes[] = {
      320 * 4,           320 * 320 * 9 * 4, 640 * 4,        640 * 640 * 4,     1280 * 1280 * 9 * 4,
      320 * 768 * 4,     1280 * 4,          1280 * 768 * 4, 640 * 320 * 9 * 4, 2560 * 4,
      640 * 640 * 9 * 4, 1280 * 1280 * 4,   640 * 768 * 4,  320 * 320 * 4};
  for (const bool device_like : {false, true}) {
    SCOPED_TRACE(device_like ? "as on a GPU" : "host memory");
    HostResource host;
    SegmentsOnlyResource segments_only(host);
    CachingPool pool(device_like ? static_cast<MemoryResource&>(segments_only)
                                 : static_cast<MemoryResource&>(host));
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
}

// A floor reached twice inside one forward pass is not the end of a step: on
// rec_sdunet_b2_32x32, 81 MiB of a 145 MiB peak, twice, before a later peak of 153 MiB.
// Consolidating there made an arena too small for what followed (1.45 x live). The pool
// consolidates when the stream empties (1.11 x; once more in the first pass while the
// pool is small and grows in 128 KiB segments), and the third pass takes no segment.
TEST(TraceReplay, AFloorInsideAPassIsNotTheEndOfAStep) {
  const EventTrace trace = read_event_trace(SDALLOC_DATA_DIR "/traces/rec_sdunet_b2_32x32.csv");
  HostResource host;
  CachingPool pool(host);
  for (int pass = 0; pass < 2; ++pass) ASSERT_TRUE(replay(trace, pool));
  const std::uint64_t taken = pool.stats().segment_allocations;
  ASSERT_TRUE(replay(trace, pool));
  const PoolStats s = pool.stats();
  EXPECT_LE(s.consolidations, 2u);
  EXPECT_EQ(s.segment_allocations, taken) << "the third pass runs in the arena";
  EXPECT_LE(
      static_cast<double>(s.peak_reserved_bytes) / static_cast<double>(trace.peak_live_bytes()),
      1.13);
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
  EXPECT_EQ(a.arena_growths, b.arena_growths);
  EXPECT_EQ(polled_upstream.stats().allocations, quiet_upstream.stats().allocations);
}

}  // namespace
}  // namespace sdalloc::conformance
