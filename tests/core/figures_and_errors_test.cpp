// figures_and_errors_test.cpp - the core's words for sizes and errors (format_bytes,
// format_size, format_exact_size, OutOfMemory::describe), PoolStats and its PyTorch key
// names, and HostStreamEvents: what every pool and resource reports through.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <sstream>
#include <string>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/core/pool_stats.hpp"
#include "sdalloc/core/stream_events.hpp"
#include "support/test_support.hpp"

namespace sdalloc {
namespace {

using test::Contains;

constexpr std::size_t kKiB = std::size_t{1} << 10;
constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kGiB = std::size_t{1} << 30;

// ---------------------------------------------------------------------------------------
// Errors and sizes

TEST(FormatBytesTest, ShowsExactBytesAndAFittingUnit) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(4096), "4096 B (4.0 KiB)");
  EXPECT_EQ(format_bytes(1536 * kKiB), "1572864 B (1.5 MiB)");
  EXPECT_EQ(format_bytes(2262839808u), "2262839808 B (2158.0 MiB)");
  EXPECT_EQ(format_bytes(80 * kGiB), "85899345920 B (80.0 GiB)");
}

TEST(FormatSizeTest, ShowsOnlyTheRoundedFigureInTheLargestUnitReached) {
  EXPECT_EQ(format_size(0), "0 B");
  EXPECT_EQ(format_size(1023), "1023 B");
  EXPECT_EQ(format_size(kKiB), "1.0 KiB");
  EXPECT_EQ(format_size(1536 * kKiB), "1.5 MiB");
  EXPECT_EQ(format_size(kGiB - 1), "1024.0 MiB");  // rounds up, stays in the unit reached
  EXPECT_EQ(format_size(8 * kGiB), "8.0 GiB");
  EXPECT_EQ(format_size(2262839808u), "2.1 GiB");  // format_bytes keeps MiB here
}

TEST(FormatSizeTest, GibDecimalsApplyOnlyToGib) {
  EXPECT_EQ(format_size(2262839808u, 2), "2.11 GiB");
  EXPECT_EQ(format_size(2262839808u, 0), "2 GiB");
  EXPECT_EQ(format_size(1536 * kKiB, 2), "1.5 MiB");
  EXPECT_EQ(format_size(3 * kKiB + 400, 2), "3.4 KiB");
  EXPECT_EQ(format_size(512, 2), "512 B");
  EXPECT_EQ(format_size(8 * kGiB, 1), format_size(8 * kGiB));
  EXPECT_EQ(format_size(kGiB, -3), "1 GiB");            // clamped to 0 decimals
  EXPECT_EQ(format_size(kGiB, 40), "1.000000000 GiB");  // clamped to 9
}

TEST(FormatExactSizeTest, UsesTheLargestUnitThatDividesTheValue) {
  EXPECT_EQ(format_exact_size(0), "0 B");
  EXPECT_EQ(format_exact_size(64), "64 B");
  EXPECT_EQ(format_exact_size(1000), "1000 B");
  EXPECT_EQ(format_exact_size(4 * kKiB), "4 KiB");
  EXPECT_EQ(format_exact_size(1536 * kKiB), "1536 KiB");
  EXPECT_EQ(format_exact_size(2 * kGiB), "2 GiB");
  EXPECT_EQ(format_exact_size(std::uint64_t{1} << 50), "1 PiB");
  EXPECT_EQ(format_exact_size(std::uint64_t{1} << 63), "8 EiB");
}

TEST(OutOfMemoryTest, DescribeStatesEveryField) {
  OutOfMemoryInfo info;
  info.requested = kGiB;
  info.live = 3 * kMiB;
  info.reserved = 5 * kMiB;
  info.largest_free = 7 * kKiB;
  info.capacity = 8 * kGiB;
  const OutOfMemory error = OutOfMemory::describe("CachingPool(host)", info, "after a retry");
  const std::string what = error.what();
  EXPECT_EQ(
      what.rfind("out of memory: CachingPool(host) could not allocate " + format_bytes(kGiB), 0),
      0u)
      << what;
  EXPECT_TRUE(Contains(what, "live " + format_bytes(3 * kMiB)));
  EXPECT_TRUE(Contains(what, "reserved " + format_bytes(5 * kMiB)));
  EXPECT_TRUE(Contains(what, "largest free block " + format_bytes(7 * kKiB)));
  EXPECT_TRUE(Contains(what, "capacity " + format_bytes(8 * kGiB)));
  EXPECT_TRUE(Contains(what, "after a retry"));
  EXPECT_EQ(error.info.requested, kGiB);
  EXPECT_EQ(error.info.live, 3 * kMiB);
  EXPECT_EQ(error.info.reserved, 5 * kMiB);
  EXPECT_EQ(error.info.largest_free, 7 * kKiB);
  EXPECT_EQ(error.info.capacity, 8 * kGiB);
}

TEST(OutOfMemoryTest, ZeroCapacityReadsAsUnlimited) {
  OutOfMemoryInfo info;
  info.requested = 100;
  const std::string what = OutOfMemory::describe("host", info).what();
  EXPECT_TRUE(Contains(what, "capacity unlimited"));
  EXPECT_EQ(what.back(), 'd') << "no detail was given, so nothing follows: " << what;
}

// ---------------------------------------------------------------------------------------
// PoolStats views

PoolStats distinct_stats() {
  PoolStats s;
  s.live_bytes = 1000;
  s.peak_live_bytes = 2000;
  s.allocated_bytes = 1024;
  s.peak_allocated_bytes = 2048;
  s.reserved_bytes = 4096;
  s.peak_reserved_bytes = 8192;
  s.live_allocations = 3;
  s.peak_live_allocations = 9;
  s.allocations = 40;
  s.frees = 37;
  s.segments = 2;
  s.peak_segments = 5;
  s.segment_allocations = 11;
  s.segment_releases = 9;
  s.free_bytes = 3072;
  s.largest_free_block = 2048;
  s.pending_free_bytes = 512;
  s.oom_retries = 6;
  s.ooms = 1;
  s.streams = 2;
  return s;
}

TEST(PoolStatsTest, MemoryStatsUsePyTorchKeyNames) {
  const std::map<std::string, std::int64_t> expected = {
      {"allocated_bytes.all.current", 1024},
      {"allocated_bytes.all.peak", 2048},
      {"requested_bytes.all.current", 1000},
      {"requested_bytes.all.peak", 2000},
      {"reserved_bytes.all.current", 4096},
      {"reserved_bytes.all.peak", 8192},
      {"active_bytes.all.current", 1024 + 512},
      {"active_bytes.all.peak", 2048},
      {"inactive_split_bytes.all.current", 3072},
      {"allocation.all.current", 3},
      {"allocation.all.peak", 9},
      {"allocation.all.allocated", 40},
      {"allocation.all.freed", 37},
      {"segment.all.current", 2},
      {"segment.all.peak", 5},
      {"num_alloc_retries", 6},
      {"num_ooms", 1},
      {"num_device_alloc", 11},
      {"num_device_free", 9},
  };
  EXPECT_EQ(to_memory_stats(distinct_stats()), expected);
}

TEST(PoolStatsTest, FragmentationIsTheShareOfFreeMemoryOutsideTheLargestBlock) {
  PoolStats s;
  EXPECT_EQ(s.fragmentation(), 0.0) << "no free memory";
  s.free_bytes = 4096;
  s.largest_free_block = 4096;
  EXPECT_EQ(s.fragmentation(), 0.0) << "one free block";
  s.largest_free_block = 1024;
  EXPECT_DOUBLE_EQ(s.fragmentation(), 0.75);
  s.largest_free_block = 0;
  EXPECT_DOUBLE_EQ(s.fragmentation(), 1.0);
}

TEST(PoolStatsTest, PeakOverheadRatioIsPeakReservedOverPeakLive) {
  PoolStats s;
  s.peak_reserved_bytes = 4096;
  EXPECT_EQ(s.peak_overhead_ratio(), 0.0) << "nothing was ever live";
  s.peak_live_bytes = 2048;
  EXPECT_DOUBLE_EQ(s.peak_overhead_ratio(), 2.0);
}

TEST(PoolStatsTest, FormattedTableShowsBytesInMiBAndRatios) {
  PoolStats s = distinct_stats();
  s.reserved_bytes = 3 * kMiB;
  s.peak_reserved_bytes = 1536 * kMiB;
  s.peak_live_bytes = 1024 * kMiB;
  const std::string table = format_stats(s);
  EXPECT_TRUE(Contains(table, "reserved"));
  EXPECT_TRUE(Contains(table, "3.0 MiB"));
  EXPECT_TRUE(Contains(table, "1536.0 MiB"));
  EXPECT_TRUE(Contains(table, "1.500"));  // peak reserved / peak live
  EXPECT_TRUE(Contains(table, "0.333"));  // fragmentation: 1 - 2048 / 3072
  EXPECT_TRUE(Contains(table, "oom retries"));
  // Aligned: every row with a figure ends its current byte count in the same column.
  std::istringstream lines(table);
  std::string line;
  std::size_t column = std::string::npos;
  while (std::getline(lines, line)) {
    const std::size_t b = line.find(" B ");
    if (b == std::string::npos) continue;
    if (column == std::string::npos) column = b;
    EXPECT_EQ(b, column) << line;
  }
}

// Spare chunks (a VirtualMemoryPool's, held but mapped nowhere) appear where there are some:
// a pool that holds none is not cluttered by the row.
TEST(PoolStatsTest, FormattedTableShowsSpareChunksWhereThereAreSome) {
  PoolStats s = distinct_stats();
  s.spare_bytes = 0;
  EXPECT_FALSE(Contains(format_stats(s), "spare chunks"));
  s.spare_bytes = 3 << 20;
  const std::string table = format_stats(s);
  const std::size_t row = table.find("spare chunks");
  ASSERT_NE(row, std::string::npos);
  EXPECT_TRUE(Contains(table.substr(row, table.find('\n', row) - row), "3.0 MiB"));
}

TEST(HostStreamEventsTest, SharedInstanceReportsEveryEventComplete) {
  HostStreamEvents& events = HostStreamEvents::instance();
  EXPECT_EQ(&events, &HostStreamEvents::instance());
  const StreamEvents::Event event = events.record(Stream(5));
  EXPECT_EQ(event, StreamEvents::kNoEvent);
  EXPECT_TRUE(events.query(event));
  events.synchronize(event);
  events.release(event);
}

}  // namespace
}  // namespace sdalloc
