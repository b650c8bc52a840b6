// Tests of the HTML report of `sdalloc replay` (tools/sdalloc/replay/html_report.hpp): its
// structure, escaping, histogram, downsampling and the errors of writing it. That it renders in a
// real browser is checked by render-report-in-chromium.py (ctest
// replay_report_renders_in_chromium).
#include "replay/html_report.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "sdalloc/core/errors.hpp"
#include "support/test_support.hpp"

namespace sdalloc::replay {
namespace {

using sdalloc::test::Contains;

std::size_t count(const std::string& text, const std::string& part) {
  std::size_t n = 0;
  for (std::size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) {
    ++n;
  }
  return n;
}

// The text from the first `begin` to the `end` after it; empty when `begin` is missing.
std::string section(const std::string& text, const std::string& begin, const std::string& end) {
  const std::size_t from = text.find(begin);
  if (from == std::string::npos) return {};
  const std::size_t to = text.find(end, from);
  return text.substr(from, to == std::string::npos ? std::string::npos : to - from);
}

std::vector<Sample> ramp(std::uint64_t events, std::uint64_t step, std::uint64_t scale) {
  std::vector<Sample> samples;
  for (std::uint64_t e = 0; e < events; e += step) {
    samples.push_back({e, e * scale, e * scale + scale * 100});
  }
  return samples;
}

AllocatorResult ran(const std::string& name, std::vector<Sample> samples) {
  AllocatorResult result;
  result.allocator = name;
  result.description = name + " over HostResource";
  result.ran = true;
  result.peak_reserved = 3ULL << 20;
  result.ratio = 1.5;
  result.ns_per_op = 42.5;
  result.pass_seconds = {0.25, 0.5};
  result.counters = "maps 3";
  result.samples = std::move(samples);
  return result;
}

AllocatorResult failed(const std::string& name, const std::string& problem) {
  AllocatorResult result;
  result.allocator = name;
  result.description = name + " allocator";
  result.problem = problem;
  return result;
}

ReplayRun three_allocators() {
  ReplayRun run;
  run.trace = "traces/unet.csv";
  run.events = 1000;
  run.allocations = 500;
  run.peak_live = 2ULL << 20;
  run.passes = 2;
  run.results.push_back(ran("pool", ramp(2000, 10, 1000)));
  run.results.push_back(failed("vmm", "no CUDA driver: install libcuda"));
  run.results.push_back(ran("glibc", ramp(2000, 10, 1200)));
  return run;
}

EventTrace trace_of_sizes(const std::vector<std::uint64_t>& sizes) {
  EventTrace trace;
  trace.source = "sizes";
  std::uint64_t id = 0;
  for (const std::uint64_t size : sizes) {
    trace.events.push_back({TraceEvent::Op::kAlloc, id, size, 0});
    trace.events.push_back({TraceEvent::Op::kFree, id, size, 0});
    ++id;
  }
  return trace;
}

TEST(HtmlReport, IsOneHtml5DocumentThatFetchesNothing) {
  const std::string html = render_html_report(three_allocators(), trace_of_sizes({64}));
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0U);
  EXPECT_TRUE(Contains(html, "Content-Security-Policy"));
  EXPECT_TRUE(Contains(html, "</html>\n"));
  for (const char* fetching :
       {"<script", "<link", "src=", "href=", "url(", "http:", "https:", "@import"}) {
    EXPECT_EQ(count(html, fetching), 0U) << fetching;
  }
}

TEST(HtmlReport, TitleNamesTraceEventsPassesAndTouch) {
  ReplayRun run = three_allocators();
  run.touch = true;
  const std::string html = render_html_report(run, trace_of_sizes({64}));
  EXPECT_TRUE(Contains(html, "<title>sdalloc replay: traces/unet.csv</title>"));
  EXPECT_TRUE(Contains(html, "1000 events per pass (500 allocations), 2 passes, --touch on"));
  EXPECT_TRUE(Contains(html, "2.0 MiB (2097152 bytes)"));
}

TEST(HtmlReport, DrawsOneSvgPerAllocatorThatRan) {
  const std::string html = render_html_report(three_allocators(), trace_of_sizes({64}));
  EXPECT_EQ(count(html, "<svg"), 2U);
  EXPECT_EQ(count(html, "</svg>"), 2U);
  EXPECT_TRUE(Contains(html, "id=\"plot-pool\""));
  EXPECT_TRUE(Contains(html, "id=\"plot-glibc\""));
  EXPECT_EQ(count(html, "id=\"plot-vmm\""), 0U);
  // Each plot: both series, the lower bound, and the one boundary between two passes.
  EXPECT_EQ(count(html, "<polyline class=\"reserved\""), 2U);
  EXPECT_EQ(count(html, "<polyline class=\"live\""), 2U);
  EXPECT_EQ(count(html, "<line class=\"bound\""), 2U);
  EXPECT_EQ(count(html, "<line class=\"pass\""), 2U);
  EXPECT_TRUE(Contains(html, ">pass 2</text>"));
}

TEST(HtmlReport, ByteAxisIsLabelledInMiB) {
  const std::string html = render_html_report(three_allocators(), trace_of_sizes({64}));
  // Highest bytes drawn: glibc's last sample, 1990 * 1200 + 120000 = 2.4 MB, about 2.4 MiB.
  EXPECT_TRUE(Contains(html, ">0 MiB</text>"));
  EXPECT_TRUE(Contains(html, ">2 MiB</text>"));
  EXPECT_TRUE(Contains(html, ">event</text>"));
}

TEST(HtmlReport, ByteAxisSwitchesToGiBForLargeFigures) {
  ReplayRun run = three_allocators();
  run.results[0].samples = {{0, 0, 0}, {1000, 3ULL << 30, 5ULL << 30}};
  const std::string html = render_html_report(run, trace_of_sizes({64}));
  EXPECT_TRUE(Contains(html, ">5 GiB</text>"));
  EXPECT_EQ(count(html, " MiB</text>"), 0U);
}

TEST(HtmlReport, TableHasOneRowPerAllocator) {
  const std::string html = render_html_report(three_allocators(), trace_of_sizes({64}));
  const std::string table = section(html, "<table class=\"results\">", "</table>");
  ASSERT_FALSE(table.empty());
  EXPECT_EQ(count(table, "<tr"), 4U);  // the header and three allocators
  EXPECT_TRUE(Contains(table, "<td class=\"name\">pool</td><td>pool over HostResource</td>"));
  EXPECT_TRUE(Contains(table, "3.0 MiB"));
  EXPECT_TRUE(Contains(table, ">1.500<"));
  EXPECT_TRUE(Contains(table, ">42.5<"));
  EXPECT_TRUE(Contains(table, "250.0 ms, 500.0 ms"));
  EXPECT_TRUE(Contains(table, "maps 3"));
  // Table order is the run's order.
  EXPECT_LT(table.find(">pool<"), table.find(">vmm<"));
  EXPECT_LT(table.find(">vmm<"), table.find(">glibc<"));
}

TEST(HtmlReport, MinCapacityShowsItsFigureOrADash) {
  ReplayRun run = three_allocators();
  run.results[0].min_capacity = 5ULL << 20;
  const std::string table = section(render_html_report(run, trace_of_sizes({64})),
                                    "<table class=\"results\">", "</table>");
  EXPECT_TRUE(Contains(section(table, ">pool<", "</tr>"), ">5.0 MiB</td>"));
  EXPECT_TRUE(Contains(section(table, ">glibc<", "</tr>"), "<td class=\"num\">-</td>"));
}

TEST(HtmlReport, ManyPassTimesShowTheirRange) {
  ReplayRun run = three_allocators();
  run.results[0].pass_seconds = {3.0, 1.0, 2.0, 5.0, 4.0};
  const std::string html = render_html_report(run, trace_of_sizes({64}));
  EXPECT_TRUE(Contains(html, "min 1.000 s, median 3.000 s, max 5.000 s (5 passes)"));
}

TEST(HtmlReport, FailingAllocatorShowsItsProblemAndNoFigures) {
  const std::string html = render_html_report(three_allocators(), trace_of_sizes({64}));
  const std::string row = section(html, "<tr class=\"failed\">", "</tr>");
  ASSERT_FALSE(row.empty());
  EXPECT_TRUE(Contains(row, ">vmm<"));
  EXPECT_TRUE(Contains(row, "did not run: no CUDA driver: install libcuda"));
  EXPECT_EQ(count(row, "MiB"), 0U);
}

TEST(HtmlReport, EscapesScriptInTraceName) {
  ReplayRun run = three_allocators();
  run.trace = "<script>alert('x')</script>&.csv";
  const std::string html = render_html_report(run, trace_of_sizes({64}));
  EXPECT_EQ(count(html, "<script"), 0U);
  EXPECT_EQ(count(html, "</script"), 0U);
  EXPECT_TRUE(Contains(html, "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;.csv"));
}

TEST(HtmlReport, EscapesAllocatorNamesDescriptionsProblemsAndCounters) {
  ReplayRun run = three_allocators();
  run.results[0].allocator = "po\"ol<b>";
  run.results[0].description = "<i>desc</i>";
  run.results[0].counters = "a<b & c>d";
  run.results[1].problem = "<img src=x onerror=alert(1)>";
  const std::string html = render_html_report(run, trace_of_sizes({64}));
  EXPECT_EQ(count(html, "ol<b>"), 0U);
  EXPECT_EQ(count(html, "<i>"), 0U);
  EXPECT_EQ(count(html, "<img"), 0U);
  EXPECT_TRUE(Contains(html, "po&quot;ol&lt;b&gt;"));
  EXPECT_TRUE(Contains(html, "id=\"plot-po&quot;ol&lt;b&gt;\""));
  EXPECT_TRUE(Contains(html, "&lt;i&gt;desc&lt;/i&gt;"));
  EXPECT_TRUE(Contains(html, "a&lt;b &amp; c&gt;d"));
  EXPECT_TRUE(Contains(html, "did not run: &lt;img src=x onerror=alert(1)&gt;"));
}

TEST(HtmlReport, EscapeHtmlReplacesEveryMarkupCharacter) {
  EXPECT_EQ(escape_html("a&b<c>d\"e'f"), "a&amp;b&lt;c&gt;d&quot;e&#39;f");
  EXPECT_EQ(escape_html(""), "");
  EXPECT_EQ(escape_html("plain text"), "plain text");
}

TEST(HtmlReport, NoAllocatorRanSaysSoAndDrawsNothing) {
  ReplayRun run = three_allocators();
  run.results = {failed("vmm", "no driver"), failed("jemalloc", "libjemalloc.so.2 not found")};
  const std::string html = render_html_report(run, trace_of_sizes({64}));
  EXPECT_EQ(count(html, "<svg"), 0U);
  EXPECT_TRUE(Contains(html, "No allocator ran"));
  EXPECT_EQ(count(html, "<tr class=\"failed\">"), 2U);
}

TEST(HtmlReport, AllocatorWithoutSamplesGetsAnEmptyPlot) {
  ReplayRun run = three_allocators();
  run.results[0].samples.clear();
  const std::string html = render_html_report(run, trace_of_sizes({64}));
  EXPECT_EQ(count(html, "<svg"), 2U);
  EXPECT_TRUE(Contains(section(html, "id=\"plot-pool\"", "</figure>"), "no samples recorded"));
}

TEST(HtmlReport, ManySamplesAreDownsampledAndTheFileStaysSmall) {
  ReplayRun run = three_allocators();
  run.events = 100000;
  for (AllocatorResult& result : run.results) {
    if (result.ran) result.samples = ramp(200000, 1, 10);
  }
  const std::string html = render_html_report(run, trace_of_sizes({64}));
  const std::string plot = section(html, R"(<polyline class="live" points=")", "/>");
  EXPECT_EQ(count(plot, ","), kMaxPlotPoints);
  EXPECT_TRUE(Contains(html, "200000 samples drawn as 2000 groups"));
  EXPECT_LT(html.size(), 300U * 1024U);
}

TEST(Downsample, ShortSeriesIsKeptAsIs) {
  const std::vector<Sample> samples = ramp(100, 1, 7);
  const std::vector<Sample> kept = downsample(samples, 100);
  ASSERT_EQ(kept.size(), samples.size());
  for (std::size_t i = 0; i < kept.size(); ++i) {
    EXPECT_EQ(kept[i].event, samples[i].event);
    EXPECT_EQ(kept[i].live_bytes, samples[i].live_bytes);
  }
  EXPECT_TRUE(downsample({}, 10).empty());
}

TEST(Downsample, GroupsKeepTheirPeaksAndTheLastEvent) {
  std::vector<Sample> samples(10000);
  for (std::uint64_t i = 0; i < samples.size(); ++i) samples[i] = {i, 100, 200};
  samples[4321].live_bytes = 999;
  samples[777].reserved_bytes = 5000;
  const std::vector<Sample> groups = downsample(samples, 2000);
  ASSERT_EQ(groups.size(), 2000U);
  EXPECT_EQ(groups.back().event, 9999U);
  std::uint64_t most_live = 0;
  std::uint64_t most_reserved = 0;
  for (std::size_t i = 0; i < groups.size(); ++i) {
    if (i > 0) {
      EXPECT_LT(groups[i - 1].event, groups[i].event);
    }
    most_live = std::max(most_live, groups[i].live_bytes);
    most_reserved = std::max(most_reserved, groups[i].reserved_bytes);
  }
  EXPECT_EQ(most_live, 999U);
  EXPECT_EQ(most_reserved, 5000U);
  EXPECT_EQ(downsample(samples, 0).size(), 1U);
}

TEST(SizeHistogram, BucketsArePowersOfTwoWithCountsAndBytes) {
  const EventTrace trace = trace_of_sizes({0, 1, 2, 3, 4, 7, 1000, 1024, 1025, 2047});
  const std::vector<SizeBucket> buckets = size_histogram(trace);
  // Buckets from [0,0] to [1024,2047], the empty ones between kept.
  ASSERT_EQ(buckets.size(), 12U);
  EXPECT_EQ(buckets[0].lower, 0U);
  EXPECT_EQ(buckets[0].upper, 0U);
  EXPECT_EQ(buckets[0].count, 1U);
  EXPECT_EQ(buckets[1].lower, 1U);
  EXPECT_EQ(buckets[1].count, 1U);
  EXPECT_EQ(buckets[2].lower, 2U);
  EXPECT_EQ(buckets[2].upper, 3U);
  EXPECT_EQ(buckets[2].count, 2U);
  EXPECT_EQ(buckets[2].bytes, 5U);
  EXPECT_EQ(buckets[3].count, 2U);  // 4 and 7
  EXPECT_EQ(buckets[4].count, 0U);  // 8..15
  EXPECT_EQ(buckets[10].lower, 512U);
  EXPECT_EQ(buckets[10].count, 1U);  // 1000
  EXPECT_EQ(buckets[11].lower, 1024U);
  EXPECT_EQ(buckets[11].upper, 2047U);
  EXPECT_EQ(buckets[11].count, 3U);
  EXPECT_EQ(buckets[11].bytes, 1024U + 1025U + 2047U);
}

TEST(SizeHistogram, HugeSizesLandInTheTopBucket) {
  const std::vector<SizeBucket> buckets = size_histogram(trace_of_sizes({~0ULL, 1ULL << 63}));
  ASSERT_EQ(buckets.size(), 1U);
  EXPECT_EQ(buckets[0].lower, 1ULL << 63);
  EXPECT_EQ(buckets[0].upper, ~0ULL);
  EXPECT_EQ(buckets[0].count, 2U);
}

TEST(SizeHistogram, TraceWithoutAllocationsHasNoBuckets) {
  EXPECT_TRUE(size_histogram(EventTrace{}).empty());
  const std::string html = render_html_report(three_allocators(), EventTrace{});
  EXPECT_TRUE(Contains(html, "The trace allocates nothing."));
}

TEST(SizeHistogram, CountsOfTheBundledTraceMatchTheTraceAndTheReport) {
  const EventTrace trace =
      read_event_trace(std::string(SDALLOC_DATA_DIR) + "/traces/sd15_unet_b2_64x64_cpu_2pass.csv");
  const std::vector<SizeBucket> buckets = size_histogram(trace);
  std::uint64_t allocations = 0;
  std::uint64_t bytes = 0;
  for (const TraceEvent& event : trace.events) {
    if (event.op == TraceEvent::Op::kAlloc) bytes += event.size;
  }
  std::uint64_t bucket_bytes = 0;
  for (const SizeBucket& bucket : buckets) {
    allocations += bucket.count;
    bucket_bytes += bucket.bytes;
    if (bucket.count > 0) {
      EXPECT_LE(bucket.lower, bucket.upper);
    }
  }
  EXPECT_EQ(allocations, trace.allocation_count());
  EXPECT_EQ(bucket_bytes, bytes);

  const std::string html = render_html_report(three_allocators(), trace);
  const std::string table = section(html, "<table class=\"histogram\">", "</table>");
  EXPECT_EQ(count(table, "<tr>"), 1 + buckets.size() + 1);  // header, buckets, total
  EXPECT_TRUE(Contains(table, "<tfoot><tr><td>all</td><td class=\"num\">" +
                                  std::to_string(trace.allocation_count()) + "</td>"));
  for (const SizeBucket& bucket : buckets) {
    EXPECT_TRUE(Contains(table, "<td class=\"num\">" + std::to_string(bucket.count) + "</td>"));
  }
}

TEST(WriteHtmlReport, WritesTheRenderedPage) {
  sdalloc::test::TempDir dir;
  const std::string path = dir.file("report.html");
  const ReplayRun run = three_allocators();
  const EventTrace trace = trace_of_sizes({64, 128});
  sdalloc::test::write_file(path, "old contents that are longer than nothing");
  write_html_report(run, trace, path);
  EXPECT_EQ(sdalloc::test::read_file(path), render_html_report(run, trace));
}

TEST(WriteHtmlReport, MissingDirectoryIsAClearError) {
  sdalloc::test::TempDir dir;
  const std::string path = dir.file("no/such/dir/report.html");
  try {
    write_html_report(three_allocators(), trace_of_sizes({64}), path);
    FAIL() << "expected sdalloc::Error";
  } catch (const sdalloc::Error& error) {
    EXPECT_TRUE(Contains(error.what(), "cannot write HTML report " + path + ": "));
    EXPECT_TRUE(Contains(error.what(), "No such file or directory"));
  }
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(WriteHtmlReport, DirectoryAsPathIsAClearError) {
  sdalloc::test::TempDir dir;
  const std::string path = dir.file("");
  try {
    write_html_report(three_allocators(), trace_of_sizes({64}), path);
    FAIL() << "expected sdalloc::Error";
  } catch (const sdalloc::Error& error) {
    EXPECT_TRUE(Contains(error.what(), "cannot write HTML report " + path + ": Is a directory"));
  }
}

TEST(WriteHtmlReport, FullDeviceIsAClearError) {
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full here";
  try {
    write_html_report(three_allocators(), trace_of_sizes({64}), "/dev/full");
    FAIL() << "expected sdalloc::Error";
  } catch (const sdalloc::Error& error) {
    EXPECT_TRUE(
        Contains(error.what(), "cannot write HTML report /dev/full: No space left on device"));
  }
}

}  // namespace
}  // namespace sdalloc::replay
