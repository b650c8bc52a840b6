// The event-trace reader and writer: the bundled real trace, gzip input, and one test per
// kind of malformed input, each checking that the error names the line and the problem.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include "sdalloc/trace/event_trace.hpp"
#include "support/test_support.hpp"

namespace sdalloc {
namespace {

using test::Contains;
using test::read_file;
using test::TempDir;
using test::write_file;
using test::write_gzip;

const std::string kBundledTrace =
    std::string(SDALLOC_DATA_DIR) + "/traces/sd15_unet_b2_64x64_cpu_2pass.csv";

EventTrace parse(const std::string& text) {
  std::istringstream in(text);
  return parse_event_trace(in, "t.csv");
}

// Parsing `text` must fail with a message starting "t.csv:<line>: " and containing `problem`.
void expect_error(const std::string& text, std::size_t line, const std::string& problem) {
  try {
    parse(text);
    ADD_FAILURE() << "accepted:\n" << text;
  } catch (const TraceFormatError& error) {
    const std::string what = error.what();
    const std::string prefix = "t.csv:" + std::to_string(line) + ": ";
    EXPECT_EQ(what.rfind(prefix, 0), 0u) << "expected prefix '" << prefix << "' in: " << what;
    EXPECT_TRUE(Contains(what, problem));
    EXPECT_EQ(error.line, line);
    EXPECT_EQ(error.source, "t.csv");
  }
}

bool same_events(const EventTrace& a, const EventTrace& b) {
  if (a.events.size() != b.events.size()) return false;
  for (std::size_t i = 0; i < a.events.size(); ++i) {
    const TraceEvent& x = a.events[i];
    const TraceEvent& y = b.events[i];
    if (x.op != y.op || x.id != y.id || x.size != y.size || x.stream != y.stream) return false;
  }
  return true;
}

// ---------------------------------------------------------------------------------------
// Good input

TEST(EventTraceTest, ReadsTheBundledTrace) {
  const EventTrace trace = read_event_trace(kBundledTrace);
  EXPECT_EQ(trace.source, kBundledTrace);
  ASSERT_EQ(trace.events.size(), 6428u);  // data/traces/*.stats.json
  EXPECT_EQ(trace.allocation_count(), 3214u);
  EXPECT_EQ(trace.peak_live_bytes(), 2262839808u);
  const TraceEvent& first = trace.events.front();
  EXPECT_EQ(first.op, TraceEvent::Op::kAlloc);
  EXPECT_EQ(first.id, 0u);
  EXPECT_EQ(first.size, 4u);
  EXPECT_EQ(first.stream, 0u);
  EXPECT_EQ(trace.events.back().op, TraceEvent::Op::kFree);
}

TEST(EventTraceTest, ReadsGzipTracesTransparently) {
  TempDir dir;
  const std::string path = dir.file("trace.csv.gz");
  write_gzip(path, read_file(kBundledTrace));
  ASSERT_NE(read_file(path).substr(0, 2), "op") << "the file must really be compressed";
  const EventTrace gz = read_event_trace(path);
  EXPECT_EQ(gz.source, path);
  EXPECT_TRUE(same_events(gz, read_event_trace(kBundledTrace)));
  EXPECT_EQ(gz.peak_live_bytes(), 2262839808u);
}

TEST(EventTraceTest, TruncatedGzipIsAnError) {
  TempDir dir;
  const std::string whole = dir.file("whole.csv.gz");
  write_gzip(whole, read_file(kBundledTrace));
  const std::string bytes = read_file(whole);
  // Cut in the middle of the compressed data, and cut only the 8-byte CRC/length trailer.
  for (const std::size_t keep : {bytes.size() / 2, bytes.size() - 4}) {
    const std::string path = dir.file("cut.csv.gz");
    write_file(path, bytes.substr(0, keep));
    try {
      read_event_trace(path);
      ADD_FAILURE() << "a gzip file cut to " << keep << " of " << bytes.size()
                    << " bytes was accepted";
    } catch (const TraceFormatError& error) {
      EXPECT_TRUE(Contains(error.what(), path + ":"));
      EXPECT_TRUE(Contains(error.what(), "truncated"));
      EXPECT_GT(error.line, 1u);
    }
  }
}

TEST(EventTraceTest, CorruptGzipIsAnError) {
  TempDir dir;
  const std::string path = dir.file("corrupt.csv.gz");
  write_gzip(path, read_file(kBundledTrace));
  std::string bytes = read_file(path);
  for (std::size_t i = bytes.size() / 3; i < bytes.size() / 3 + 64; ++i) bytes[i] ^= 0x5a;
  write_file(path, bytes);
  try {
    read_event_trace(path);
    FAIL() << "a corrupt gzip file was accepted";
  } catch (const TraceFormatError& error) {
    EXPECT_TRUE(Contains(error.what(), path + ":"));
    EXPECT_TRUE(Contains(error.what(), "cannot decompress"));
  }
}

TEST(EventTraceTest, MissingFileIsReportedWithItsPath) {
  const std::string path = "/nonexistent-sdalloc-dir/trace.csv";
  try {
    read_event_trace(path);
    FAIL() << "read a file that does not exist";
  } catch (const TraceFormatError& error) {
    EXPECT_TRUE(Contains(error.what(), path + ": cannot open"));
  }
}

TEST(EventTraceTest, StreamColumnIsOptional) {
  const EventTrace without = parse("op,id,size\na,0,4\nf,0,4\n");
  ASSERT_EQ(without.events.size(), 2u);
  EXPECT_EQ(without.events[0].stream, 0u);
  const EventTrace with = parse("op,id,size,stream\na,0,4,7\nf,0,4,9\n");
  ASSERT_EQ(with.events.size(), 2u);
  EXPECT_EQ(with.events[0].stream, 7u);
  EXPECT_EQ(with.events[1].stream, 9u);
  EXPECT_EQ(with.events[1].op, TraceEvent::Op::kFree);
}

TEST(EventTraceTest, CrlfLineEndsAndAMissingFinalNewlineAreAccepted) {
  const EventTrace crlf = parse("op,id,size,stream\r\na,0,4,1\r\nf,0,4,1\r\n");
  ASSERT_EQ(crlf.events.size(), 2u);
  EXPECT_EQ(crlf.events[1].stream, 1u);
  EXPECT_EQ(parse("op,id,size\na,0,4\nf,0,4").events.size(), 2u);
}

TEST(EventTraceTest, AllocationsMayStayLiveAtTheEnd) {
  const EventTrace trace = parse("op,id,size\na,0,100\na,1,50\nf,0,100\na,2,70\n");
  EXPECT_EQ(trace.events.size(), 4u);
  EXPECT_EQ(trace.allocation_count(), 3u);
  EXPECT_EQ(trace.peak_live_bytes(), 150u);
}

TEST(EventTraceTest, HeaderOnlyIsAnEmptyTrace) {
  const EventTrace trace = parse("op,id,size\n");
  EXPECT_TRUE(trace.events.empty());
  EXPECT_EQ(trace.peak_live_bytes(), 0u);
}

TEST(EventTraceTest, WrittenTraceParsesBackToTheSameEvents) {
  const EventTrace original = parse("op,id,size,stream\na,0,4,3\na,1,9,0\nf,1,9,0\nf,0,4,3\n");
  std::ostringstream out;
  write_event_trace(original, out);
  EXPECT_EQ(out.str(), "op,id,size,stream\na,0,4,3\na,1,9,0\nf,1,9,0\nf,0,4,3\n");
  EXPECT_TRUE(same_events(parse(out.str()), original));
}

TEST(EventTraceTest, WriterOmitsTheStreamColumnWhenEveryStreamIsZero) {
  const std::string text = read_file(kBundledTrace);
  std::ostringstream out;
  write_event_trace(read_event_trace(kBundledTrace), out);
  EXPECT_EQ(out.str(), text);
}

TEST(EventTraceTest, HundredThousandLinesParseQuickly) {
  std::string text = "op,id,size,stream\n";
  for (int i = 0; i < 50000; ++i) {
    const std::string tail = std::to_string(i) + "," + std::to_string(512 + i) + ",0\n";
    text += "a," + tail;
    text += "f," + tail;
  }
  const auto start = std::chrono::steady_clock::now();
  const EventTrace trace = parse(text);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(trace.events.size(), 100000u);
  // Generous for Debug and sanitizer builds; a regex-per-line parser takes far longer.
  EXPECT_LT(std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count(), 3000);
}

// ---------------------------------------------------------------------------------------
// Malformed input: one test per problem; each names the line.

TEST(EventTraceErrorTest, EmptyInputIsRejected) { expect_error("", 1, "empty trace"); }

TEST(EventTraceErrorTest, MissingHeaderIsRejected) {
  expect_error("a,0,4\nf,0,4\n", 1, "bad header 'a,0,4'");
  expect_error("op,id\na,0\n", 1, "bad header");
  expect_error("op,id,size,stream,extra\n", 1, "bad header");
}

TEST(EventTraceErrorTest, UnknownOpIsRejected) {
  expect_error("op,id,size\na,0,4\nx,0,4\n", 3, "unknown op 'x'");
  expect_error("op,id,size\nalloc,0,4\n", 2, "unknown op 'alloc'");
  expect_error("op,id,size\nA,0,4\n", 2, "unknown op 'A'");
}

TEST(EventTraceErrorTest, NegativeNumbersAreRejected) {
  expect_error("op,id,size\na,-5,4\n", 2, "id '-5' is not a non-negative integer");
  expect_error("op,id,size\na,0,-4\n", 2, "size '-4' is not a non-negative integer");
}

TEST(EventTraceErrorTest, FractionalSizeIsRejected) {
  expect_error("op,id,size\na,0,1.5\n", 2, "size '1.5' is not a non-negative integer");
}

TEST(EventTraceErrorTest, NonNumericFieldsAreRejected) {
  expect_error("op,id,size\na,abc,4\n", 2, "id 'abc' is not a non-negative integer");
  expect_error("op,id,size\na,0, 4\n", 2, "size ' 4' is not a non-negative integer");
  expect_error("op,id,size\na,0,4k\n", 2, "size '4k'");
  expect_error("op,id,size,stream\na,0,4,s1\n", 2, "stream 's1' is not a non-negative integer");
}

TEST(EventTraceErrorTest, NumberBeyondSixtyFourBitsIsRejected) {
  expect_error("op,id,size\na,0,18446744073709551616\n", 2, "too large");
}

TEST(EventTraceErrorTest, EmptyFieldsAreRejected) {
  expect_error("op,id,size\na,,4\n", 2, "id is empty");
  expect_error("op,id,size\na,0,\n", 2, "size is empty");
  expect_error("op,id,size\n,0,4\n", 2, "unknown op ''");
  expect_error("op,id,size,stream\na,0,4,\n", 2, "stream is empty");
}

TEST(EventTraceErrorTest, WrongNumberOfFieldsIsRejected) {
  expect_error("op,id,size\na,0,4,0\n", 2, "expected 3 fields (op,id,size), found 4");
  expect_error("op,id,size\na,0\n", 2, "expected 3 fields (op,id,size), found 2");
  expect_error("op,id,size,stream\na,0,4\n", 2, "expected 4 fields (op,id,size,stream), found 3");
  expect_error("op,id,size,stream\na,0,4,0,1\n", 2, "found 5");
}

TEST(EventTraceErrorTest, BlankLineIsRejected) {
  expect_error("op,id,size\na,0,4\n\nf,0,4\n", 3, "empty line");
  expect_error("op,id,size\na,0,4\n\n", 3, "empty line");
}

TEST(EventTraceErrorTest, ReusedIdIsRejected) {
  expect_error("op,id,size\na,0,4\na,0,8\n", 3,
               "allocation of id 0, which was already allocated on line 2");
  expect_error("op,id,size\na,7,4\nf,7,4\na,7,4\n", 4,
               "id 7, which was already allocated on line 2 and freed on line 3");
}

TEST(EventTraceErrorTest, FreeOfAnIdNeverAllocatedIsRejected) {
  expect_error("op,id,size\na,0,4\nf,1,4\n", 3, "free of id 1, which was never allocated");
}

TEST(EventTraceErrorTest, DoubleFreeIsRejected) {
  expect_error("op,id,size\na,0,4\nf,0,4\nf,0,4\n", 4,
               "free of id 0, which was already freed on line 3");
}

TEST(EventTraceErrorTest, FreeWithADifferentSizeIsRejected) {
  expect_error("op,id,size\na,3,200\nf,3,100\n", 3,
               "free of id 3 with size 100, but it was allocated with size 200 on line 2");
}

TEST(EventTraceErrorTest, ErrorsInAFileNameTheFile) {
  TempDir dir;
  const std::string path = dir.file("bad.csv");
  write_file(path, "op,id,size\na,0,4\nf,0,5\n");
  try {
    read_event_trace(path);
    FAIL() << "accepted a bad file";
  } catch (const TraceFormatError& error) {
    EXPECT_EQ(std::string(error.what()).rfind(path + ":3: free of id 0 with size 5", 0), 0u)
        << error.what();
  }
}

TEST(EventTraceErrorTest, TraceFormatErrorIsAnInvalidArgument) {
  EXPECT_THROW(parse("nonsense\n"), InvalidArgument);
}

}  // namespace
}  // namespace sdalloc
