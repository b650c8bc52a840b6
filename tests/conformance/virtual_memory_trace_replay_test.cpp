// virtual_memory_trace_replay_test.cpp - the bars for VirtualMemoryPool, on every
// bundled trace (data/traces/*.csv, real PyTorch allocation traces).
//
// Replayed through a default VirtualMemoryPool over HostVirtualMemory:
//  - the pool's peak live bytes equal the trace's (it counts requests exactly);
//  - its peak mapped bytes, and its peak physical bytes (mapped + spare chunks), stay within
//    5% of the peak live bytes (PyTorch reaches 1.015 with expandable segments on the UNet
//    trace, 1.47 without);
//  - the same replay runs under a physical cap of 1.05 x the peak live bytes.
// The memory is never touched: mapped pages that are never written cost no memory, so
// replaying 53 GB of allocations costs only the pool's work and its map calls.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "conformance/trace_replay.hpp"
#include "sdalloc/core/errors.hpp"
#include "sdalloc/policies/virtual_memory_pool.hpp"
#include "sdalloc/resources/host_virtual_memory.hpp"
#include "sdalloc/trace/event_trace.hpp"

namespace sdalloc::conformance {
namespace {

constexpr double kMaxPeakRatio = 1.05;

double ratio(std::size_t a, std::size_t b) {
  return static_cast<double>(a) / static_cast<double>(b);
}

class VirtualMemoryTraceReplay : public ::testing::TestWithParam<std::string> {};

// A default pool's figures after the second and after the third of three replays of a
// bundled trace: what the third pass, a loop's steady state, did.
struct ThirdPass {
  EventTrace trace;
  VirtualMemoryPoolStats before;
  VirtualMemoryPoolStats after;
};
::testing::AssertionResult replay_three_passes(const char* name, ThirdPass& out) {
  out.trace = read_event_trace(std::string(SDALLOC_DATA_DIR "/traces/") + name);
  HostVirtualMemory memory;
  VirtualMemoryPool pool(memory);
  if (!replay(out.trace, pool) || !replay(out.trace, pool)) {
    return ::testing::AssertionFailure() << "the first two passes failed";
  }
  out.before = pool.vm_stats();
  if (!replay(out.trace, pool)) return ::testing::AssertionFailure() << "the third pass failed";
  out.after = pool.vm_stats();
  return ::testing::AssertionSuccess();
}

// Issue 16: a loop's later passes find their pages where they left them. With the default
// growth_slack (0.04) these traces move no page in their third pass (with 0.03 the VAE
// decoder and the batch-1 UNet still moved 79 and 855 pages in it).
TEST(VirtualMemoryTraceReplayPasses, TheThirdPassMovesNoPage) {
  for (const char* name : {"rec_vae_b1_8x8.csv", "rec_sdunet_b1_16x16.csv",
                           "sd15_unet_b2_64x64_sliced_cpu_2pass.csv"}) {
    SCOPED_TRACE(name);
    ThirdPass pass;
    ASSERT_TRUE(replay_three_passes(name, pass));
    const VirtualMemoryPoolStats& before = pass.before;
    const VirtualMemoryPoolStats& after = pass.after;
    EXPECT_EQ(after.unmaps, before.unmaps);
    EXPECT_EQ(after.maps, before.maps);
    EXPECT_EQ(after.remapped_pages, before.remapped_pages);
    EXPECT_LE(ratio(after.peak_physical_bytes, pass.trace.peak_live_bytes()), kMaxPeakRatio);
  }
}

// Issue 16: where a pass's pages do not fit in the slack, some move in every pass. Free
// pages are taken from the top of the largest free blocks (the range's tail, which best fit
// reaches last), so a later pass moves a fraction of its live pages. Taking them from the
// smallest free blocks, lowest pages first, moved 1.0-2.8 x the peak live pages in each
// later pass on these traces (2.5 x on rec_sdunet_b2_32x32, 2.8 x on SDXL).
TEST(VirtualMemoryTraceReplayPasses, ALaterPassMovesFewPages) {
  for (const char* name : {"rec_sdunet_b2_32x32.csv", "rec_sdunet_b1_40x40.csv",
                           "rec_sdunet_b2_24x24.csv", "sdxl_unet_b2_64x64_sliced_cpu.csv"}) {
    SCOPED_TRACE(name);
    ThirdPass pass;
    ASSERT_TRUE(replay_three_passes(name, pass));
    const std::size_t peak_live = pass.trace.peak_live_bytes();
    const std::size_t live_pages = peak_live / (std::size_t{64} << 10);  // host pages
    const std::size_t moved = pass.after.remapped_pages - pass.before.remapped_pages;
    std::cout << name << ": third pass moved " << moved << " pages, peak live " << live_pages
              << " pages\n";
    EXPECT_LE(ratio(moved, live_pages), 0.5);
    EXPECT_LE(ratio(pass.after.peak_physical_bytes, peak_live), kMaxPeakRatio);
  }
}

// A loop that moves pages in every pass makes about as many move calls in its tenth pass as
// in its third. Moved pages go under a request in the order of their chunks' handles, so
// pages whose chunks follow each other end up side by side and move together next time; in
// address order each move laid runs from several places side by side, and the calls per
// pass grew with every pass (docs/notebook/virtual_memory_pool.md).
TEST(VirtualMemoryTraceReplayPasses, TheMoveCallsOfALoopDoNotGrowWithThePasses) {
  const EventTrace trace =
      read_event_trace(std::string(SDALLOC_DATA_DIR "/traces/") + "rec_tv_resnet50_b4_224.csv");
  HostVirtualMemory memory;
  if (!memory.can_move()) GTEST_SKIP() << "this kernel cannot move mappings (mremap DONTUNMAP)";
  VirtualMemoryPool pool(memory);
  std::vector<std::uint64_t> moves{0};
  for (int pass = 0; pass < 10; ++pass) {
    ASSERT_TRUE(replay(trace, pool)) << "pass " << pass + 1;
    moves.push_back(pool.vm_stats().moves);
  }
  const std::uint64_t third = moves[3] - moves[2];
  const std::uint64_t tenth = moves[10] - moves[9];
  std::cout << "move calls: third pass " << third << ", tenth pass " << tenth << "\n";
  ASSERT_GT(third, 0u) << "the trace no longer moves pages: pick one that does";
  EXPECT_LE(static_cast<double>(tenth), 1.2 * static_cast<double>(third));
  EXPECT_LE(ratio(pool.vm_stats().peak_physical_bytes, trace.peak_live_bytes()), kMaxPeakRatio);
  EXPECT_NO_THROW(pool.check_invariants());
}

TEST_P(VirtualMemoryTraceReplay, PeakMappedStaysWithinFivePercentOfPeakLive) {
  const EventTrace trace = read_event_trace(GetParam());
  HostVirtualMemory memory;
  VirtualMemoryPool pool(memory);
  ASSERT_TRUE(replay(trace, pool));
  const VirtualMemoryPoolStats s = pool.vm_stats();
  EXPECT_EQ(s.peak_live_bytes, trace.peak_live_bytes());
  EXPECT_EQ(s.live_bytes, 0u);
  const double mapped = ratio(s.peak_mapped_bytes, s.peak_live_bytes);
  const double physical = ratio(s.peak_physical_bytes, s.peak_live_bytes);
  std::cout << std::filesystem::path(GetParam()).filename().string() << ": peak live "
            << s.peak_live_bytes << ", peak mapped " << s.peak_mapped_bytes << " (" << mapped
            << "), peak physical " << s.peak_physical_bytes << " (" << physical << "), maps "
            << s.maps << ", unmaps " << s.unmaps << ", creates " << s.creates << ", remapped pages "
            << s.remapped_pages << "\n";
  RecordProperty("peak_mapped_ratio", std::to_string(mapped));
  EXPECT_LE(mapped, kMaxPeakRatio);
  EXPECT_LE(physical, kMaxPeakRatio);
  EXPECT_NO_THROW(pool.check_invariants());
  EXPECT_EQ(memory.mapped_bytes(), s.mapped_bytes);
  EXPECT_EQ(memory.physical_bytes(), s.physical_bytes);
}

TEST_P(VirtualMemoryTraceReplay, RunsUnderAPhysicalCapOfOnePointOFiveTimesPeakLive) {
  const EventTrace trace = read_event_trace(GetParam());
  const std::size_t cap =
      static_cast<std::size_t>(kMaxPeakRatio * static_cast<double>(trace.peak_live_bytes())) /
      HostVirtualMemory::kPageSize * HostVirtualMemory::kPageSize;
  HostVirtualMemory memory;
  VirtualMemoryPool pool(memory, {.max_physical_bytes = cap});
  EXPECT_TRUE(replay(trace, pool)) << "under a cap of " << format_bytes(cap);
  const VirtualMemoryPoolStats s = pool.vm_stats();
  EXPECT_EQ(s.peak_live_bytes, trace.peak_live_bytes());
  EXPECT_LE(s.peak_physical_bytes, cap);
  EXPECT_EQ(s.ooms, 0u);
  EXPECT_NO_THROW(pool.check_invariants());
}

INSTANTIATE_TEST_SUITE_P(BundledTraces, VirtualMemoryTraceReplay,
                         ::testing::ValuesIn(bundled_traces()), trace_test_name);

}  // namespace
}  // namespace sdalloc::conformance
