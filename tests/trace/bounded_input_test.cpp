// Issue 15, F7: trace input is streamed and bounded. A file that is no trace (/dev/zero, a
// gzip of zeros) fails from its first bytes, fast and without reading the rest; a line longer
// than TraceLimits::max_line_bytes, or more input than TraceLimits::max_bytes, is a
// TraceFormatError naming the line; lines that cross the reader's chunks read as they are.
#include <gtest/gtest.h>
#include <zlib.h>

#include <chrono>
#include <filesystem>
#include <sstream>
#include <string>

#include "sdalloc/trace/event_trace.hpp"
#include "sdalloc/trace/rmm_log.hpp"
#include "sdalloc/trace/trace_input.hpp"
#include "support/test_support.hpp"
#include "trace/text_lines.hpp"

namespace sdalloc {
namespace {

using test::Contains;
using test::TempDir;

using Clock = std::chrono::steady_clock;

// `megabytes` MiB of zero bytes behind `prefix`, gzip-compressed into `path` a MiB at a time.
void write_gzip_of_zeros(const std::string& path, const std::string& prefix, int megabytes) {
  gzFile file = gzopen(path.c_str(), "wb1");
  ASSERT_NE(file, nullptr);
  if (!prefix.empty()) gzwrite(file, prefix.data(), static_cast<unsigned>(prefix.size()));
  const std::string zeros(std::size_t{1} << 20, '\0');
  for (int i = 0; i < megabytes; ++i) {
    ASSERT_EQ(gzwrite(file, zeros.data(), static_cast<unsigned>(zeros.size())),
              static_cast<int>(zeros.size()));
  }
  ASSERT_EQ(gzclose(file), Z_OK);
}

template <typename Read>
TraceFormatError error_of(Read read) {
  try {
    read();
  } catch (const TraceFormatError& error) {
    return error;
  }
  ADD_FAILURE() << "no TraceFormatError";
  return TraceFormatError("none", 0, "none");
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

TEST(BoundedInput, F7_DevZeroIsRefusedFromItsFirstBytes) {
  if (!std::filesystem::exists("/dev/zero")) GTEST_SKIP() << "no /dev/zero";
  const Clock::time_point start = Clock::now();
  const TraceFormatError any = error_of([] { read_any_trace("/dev/zero"); });
  EXPECT_EQ(any.line, 1u);
  EXPECT_TRUE(Contains(any.what(), "unrecognised trace format: first line is binary data"));
  // The event-trace reader alone stops at the line bound.
  const TraceFormatError events = error_of([] { read_event_trace("/dev/zero"); });
  EXPECT_EQ(events.line, 1u);
  EXPECT_TRUE(Contains(events.what(), "line is longer than 1048576 bytes")) << events.what();
  const TraceFormatError log = error_of([] { read_rmm_log("/dev/zero"); });
  EXPECT_TRUE(Contains(log.what(), "line is longer than 1048576 bytes")) << log.what();
  EXPECT_LT(seconds_since(start), 10.0);  // milliseconds in fact; the finding grew for 53 s
}

TEST(BoundedInput, F7_GzipOfZerosIsRefusedWithoutDecompressingIt) {
  TempDir dir;
  const std::string whole = dir.file("zeros.csv.gz");
  write_gzip_of_zeros(whole, "", 64);
  // Cut off the end: a reader that decompressed it all would meet the truncation and say so;
  // one that tells the format from the first bytes never gets there.
  const std::string bytes = test::read_file(whole);
  const std::string bomb = dir.file("cut.csv.gz");
  test::write_file(bomb, bytes.substr(0, bytes.size() / 2));
  const Clock::time_point start = Clock::now();
  const TraceFormatError error = error_of([&] { read_any_trace(bomb); });
  EXPECT_EQ(error.line, 1u);
  EXPECT_TRUE(Contains(error.what(), "binary data")) << error.what();
  EXPECT_LT(seconds_since(start), 5.0);
}

TEST(BoundedInput, F7_ZerosAfterAValidHeaderStopAtTheLineBound) {
  TempDir dir;
  const std::string path = dir.file("header_then_zeros.csv.gz");
  write_gzip_of_zeros(path, "op,id,size\na,0,16\n", 4);
  const TraceFormatError error = error_of([&] { read_any_trace(path); });
  EXPECT_EQ(error.line, 3u);
  EXPECT_TRUE(Contains(error.what(), "line is longer than 1048576 bytes")) << error.what();
}

TEST(BoundedInput, F7_ALineBeyondMaxLineBytesNamesItsLine) {
  TraceLimits limits;
  limits.max_line_bytes = 64;
  std::istringstream in("op,id,size\na,0,16\na,1," + std::string(100, '7') + "\n");
  const TraceFormatError error = error_of([&] { parse_event_trace(in, "t.csv", limits); });
  EXPECT_EQ(error.line, 3u);
  EXPECT_STREQ(error.what(),
               "t.csv:3: line is longer than 64 bytes, the limit for one line "
               "(TraceLimits::max_line_bytes): is this a text trace?");
  // The same line without its end (the last line of the input) is caught too.
  const std::string log = std::string(kRmmLogHeader) + "\n" + std::string(65, 'x');
  EXPECT_EQ(error_of([&] { parse_rmm_log(log, "log.csv", limits); }).line, 2u);
  // A line of exactly the limit is fine.
  std::istringstream fits("op,id,size\na,1," + std::string(60, '1') + "\n");  // 64 bytes
  EXPECT_TRUE(Contains(error_of([&] { parse_event_trace(fits, "t.csv", limits); }).what(),
                       "too large"));  // the number is refused, not the line
}

TEST(BoundedInput, F7_InputBeyondMaxBytesIsAnErrorOnTheLineReached) {
  TempDir dir;
  std::string text = "op,id,size\n";
  for (int i = 0; i < 100000; ++i) text += "a," + std::to_string(i) + ",16\n";
  const std::string path = dir.file("big.csv");
  test::write_file(path, text);
  TraceLimits limits;
  limits.max_bytes = 300000;  // the reader reads 256 KiB at a time: the second read passes it
  const TraceFormatError error = error_of([&] { read_any_trace(path, limits); });
  EXPECT_GT(error.line, 1u);
  EXPECT_TRUE(Contains(error.what(), "the input is longer than 300000 bytes")) << error.what();
  limits.max_bytes = text.size();
  EXPECT_EQ(read_any_trace(path, limits).events.size(), 100000u);
}

TEST(BoundedInput, LinesAcrossChunksAndCrlfReadAsTheyAre) {
  // Lines of every length from 1 to 999 bytes, so that many of them cross a 256 KiB chunk.
  std::string text;
  std::size_t total = 0;
  for (std::size_t n = 1; total < (std::size_t{3} << 18); n = n % 999 + 1) {
    text += std::string(n, 'x') + (n % 2 == 0 ? "\r\n" : "\n");
    total = text.size();
  }
  detail::TextLines lines("t", std::string_view(text), TraceLimits{});
  std::string_view line;
  std::size_t expected = 1;
  std::size_t count = 0;
  while (lines.next(line)) {
    ASSERT_EQ(line, std::string(expected, 'x')) << "line " << lines.number();
    expected = expected % 999 + 1;
    ++count;
  }
  EXPECT_EQ(count, lines.number());
  EXPECT_GT(count, 1000u);
}

TEST(BoundedInput, PeekDoesNotConsumeAndEndsWithTheInput) {
  std::istringstream in("op,id,size\na,0,1\n");
  detail::TextLines lines("t", in, TraceLimits{});
  EXPECT_EQ(lines.peek(4096), "op,id,size\na,0,1\n");
  std::string_view line;
  ASSERT_TRUE(lines.next(line));
  EXPECT_EQ(line, "op,id,size");
  EXPECT_EQ(lines.peek(3), "a,0");
  ASSERT_TRUE(lines.next(line));
  EXPECT_EQ(line, "a,0,1");
  EXPECT_FALSE(lines.next(line));
  EXPECT_EQ(lines.peek(10), "");
}

}  // namespace
}  // namespace sdalloc
