// The RMM log reader: the sample log converts to the expected events, and every kind of
// malformed line is rejected with an error naming the line and the problem.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "sdalloc/trace/rmm_log.hpp"
#include "support/test_support.hpp"

namespace sdalloc {
namespace {

using test::Contains;

const std::string kSampleLog = std::string(SDALLOC_DATA_DIR) + "/samples/rmm_log_sample.csv";
const std::string kHeader = "Thread,Time,Action,Pointer,Size,Stream\n";

// The message of the TraceFormatError that parsing `text` throws; fails the test if none.
std::string ParseError(const std::string& text, std::size_t expected_line) {
  try {
    parse_rmm_log(text, "log.csv");
  } catch (const TraceFormatError& error) {
    EXPECT_EQ(error.line, expected_line) << error.what();
    EXPECT_EQ(error.source, "log.csv");
    return error.what();
  }
  ADD_FAILURE() << "no TraceFormatError for:\n" << text;
  return {};
}

TraceEvent Alloc(std::uint64_t id, std::uint64_t size, std::uint64_t stream) {
  return {TraceEvent::Op::kAlloc, id, size, stream};
}
TraceEvent Free(std::uint64_t id, std::uint64_t size, std::uint64_t stream) {
  return {TraceEvent::Op::kFree, id, size, stream};
}

void ExpectEvents(const std::vector<TraceEvent>& actual, const std::vector<TraceEvent>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(actual[i].op, expected[i].op) << "event " << i;
    EXPECT_EQ(actual[i].id, expected[i].id) << "event " << i;
    EXPECT_EQ(actual[i].size, expected[i].size) << "event " << i;
    EXPECT_EQ(actual[i].stream, expected[i].stream) << "event " << i;
  }
}

TEST(RmmLog, SampleLogConvertsToEventsWithPeakLive) {
  const RmmLog log = read_rmm_log(kSampleLog);
  EXPECT_EQ(log.trace.source, kSampleLog);
  ExpectEvents(log.trace.events, {Alloc(0, 1024, 0), Alloc(1, 2048, 0), Alloc(2, 1048576, 1),
                                  Free(0, 1024, 0), Alloc(3, 512, 1), Free(2, 1048576, 1),
                                  Free(1, 2048, 0), Alloc(4, 4194304, 1), Free(4, 4194304, 0)});
  EXPECT_EQ(log.trace.peak_live_bytes(), 4194816u);
  EXPECT_EQ(log.trace.allocation_count(), 5u);
  EXPECT_EQ(log.allocation_failures, 1u);
  EXPECT_EQ(log.null_zero_byte_events, 2u);
  EXPECT_EQ(log.streams, (std::vector<std::uint64_t>{0, 0x55d0c3a1e0b0}));
}

TEST(RmmLog, StreamsAreNumberedInOrderOfFirstAppearance) {
  const RmmLog log = parse_rmm_log(kHeader +
                                       "1,00:00:00.000001,allocate,0x10,8,0x7f00aa\n"
                                       "1,00:00:00.000002,allocate,0x20,8,0\n"
                                       "1,00:00:00.000003,allocate,0x30,8,0x7F00AA\n"
                                       "1,00:00:00.000004,allocate,0x40,8,0x0\n",
                                   "log.csv");
  ExpectEvents(log.trace.events, {Alloc(0, 8, 0), Alloc(1, 8, 1), Alloc(2, 8, 0), Alloc(3, 8, 1)});
  EXPECT_EQ(log.streams, (std::vector<std::uint64_t>{0x7f00aa, 0}));
}

// Found by the trace fuzzer (tests/fuzz/corpus/trace/rmm_streams_of_skipped_lines): a
// handle seen only on skipped lines (allocate failures, null zero-byte calls) was numbered
// too, so `streams` named streams no event used. Its handle is still checked.
TEST(RmmLog, StreamsOfSkippedLinesAreNotNumbered) {
  const RmmLog log = parse_rmm_log(kHeader +
                                       "1,t,allocate failure,0,99,0x2\n"
                                       "1,t,allocate,(nil),0,0x3\n"
                                       "1,t,allocate,0x10,8,0x4\n"
                                       "1,t,allocate failure,0,99,0x5\n"
                                       "1,t,free,0x10,8,0x2\n",
                                   "log.csv");
  ExpectEvents(log.trace.events, {Alloc(0, 8, 0), Free(0, 8, 1)});
  EXPECT_EQ(log.streams, (std::vector<std::uint64_t>{0x4, 0x2}));
  EXPECT_EQ(log.allocation_failures, 2u);
  EXPECT_EQ(log.null_zero_byte_events, 1u);
  EXPECT_TRUE(Contains(ParseError(kHeader + "1,t,allocate failure,0,99,zz\n", 2), "stream"));
}

TEST(RmmLog, PointerReusedAfterFreeGetsAFreshId) {
  const RmmLog log = parse_rmm_log(kHeader +
                                       "1,t,allocate,0x7f0000001000,64,0\n"
                                       "1,t,free,0x7f0000001000,64,0\n"
                                       "1,t,allocate,0x7f0000001000,128,0\n",
                                   "log.csv");
  ExpectEvents(log.trace.events, {Alloc(0, 64, 0), Free(0, 64, 0), Alloc(1, 128, 0)});
}

TEST(RmmLog, AcceptsCrLfBarePointerDigitsAndDeallocateSpelling) {
  const RmmLog log = parse_rmm_log(
      "Thread,Time,Action,Pointer,Size,Stream\r\n"
      "1,t,allocate,7f0000001000,64,0\r\n"
      "1,t,deallocate,0x7F0000001000,64,0\r\n",
      "log.csv");
  ExpectEvents(log.trace.events, {Alloc(0, 64, 0), Free(0, 64, 0)});
}

TEST(RmmLog, HeaderOnlyLogIsAnEmptyTrace) {
  const RmmLog log = parse_rmm_log(kHeader, "log.csv");
  EXPECT_TRUE(log.trace.events.empty());
  EXPECT_EQ(log.trace.peak_live_bytes(), 0u);
}

TEST(RmmLog, EmptyInputIsRejected) {
  EXPECT_TRUE(Contains(ParseError("", 1), "log.csv:1: empty log"));
}

TEST(RmmLog, BadHeaderIsRejected) {
  const std::string message = ParseError("Thread,Time,Action,Pointer,Size\n", 1);
  EXPECT_TRUE(Contains(message, "log.csv:1: bad header 'Thread,Time,Action,Pointer,Size'"));
  EXPECT_TRUE(Contains(message, "expected 'Thread,Time,Action,Pointer,Size,Stream'"));
}

TEST(RmmLog, UnknownActionIsRejected) {
  const std::string message =
      ParseError(kHeader + "1,t,allocate,0x10,8,0\n1,t,release,0x10,8,0\n", 3);
  EXPECT_TRUE(Contains(message, "log.csv:3: unknown action 'release'"));
}

TEST(RmmLog, BadPointerIsRejected) {
  EXPECT_TRUE(Contains(ParseError(kHeader + "1,t,allocate,0xZZ10,8,0\n", 2),
                       "log.csv:2: pointer '0xZZ10' is not a hexadecimal address"));
  EXPECT_TRUE(Contains(ParseError(kHeader + "1,t,allocate,,8,0\n", 2), "pointer '' is not"));
  EXPECT_TRUE(Contains(ParseError(kHeader + "1,t,allocate,0x1ffffffffffffffff,8,0\n", 2),
                       "does not fit 64 bits"));
}

TEST(RmmLog, NegativeSizeIsRejected) {
  EXPECT_TRUE(Contains(ParseError(kHeader + "1,t,allocate,0x10,-8,0\n", 2),
                       "log.csv:2: size '-8' is not a non-negative integer"));
}

TEST(RmmLog, NonNumericSizeIsRejected) {
  EXPECT_TRUE(Contains(ParseError(kHeader + "1,t,allocate,0x10,8.5,0\n", 2),
                       "log.csv:2: size '8.5' is not a non-negative integer"));
  EXPECT_TRUE(
      Contains(ParseError(kHeader + "1,t,allocate,0x10,99999999999999999999,0\n", 2), "too large"));
}

TEST(RmmLog, BadStreamIsRejected) {
  EXPECT_TRUE(Contains(ParseError(kHeader + "1,t,allocate,0x10,8,stream7\n", 2),
                       "log.csv:2: stream 'stream7' is not a non-negative integer"));
  EXPECT_TRUE(Contains(ParseError(kHeader + "1,t,allocate,0x10,8,0xg\n", 2),
                       "stream '0xg' is not a stream handle"));
}

TEST(RmmLog, WrongFieldCountIsRejected) {
  EXPECT_TRUE(
      Contains(ParseError(kHeader + "1,t,allocate,0x10,8\n", 2), "log.csv:2: expected 6 fields"));
  EXPECT_TRUE(Contains(ParseError(kHeader + "1,t,allocate,0x10,8,0,extra\n", 2), "found 7"));
}

TEST(RmmLog, EmptyLineIsRejected) {
  EXPECT_TRUE(Contains(ParseError(kHeader + "1,t,allocate,0x10,8,0\n\n1,t,free,0x10,8,0\n", 3),
                       "log.csv:3: empty line"));
}

TEST(RmmLog, FreeOfUnknownPointerIsRejected) {
  const std::string message =
      ParseError(kHeader + "1,t,allocate,0x10,8,0\n1,t,free,0x7f00,8,0\n", 3);
  EXPECT_TRUE(Contains(message, "log.csv:3: free of pointer 0x7f00, which is not live"));
  EXPECT_TRUE(Contains(message, "never allocated"));
}

TEST(RmmLog, DoubleFreeNamesTheFirstFree) {
  const std::string message =
      ParseError(kHeader + "1,t,allocate,0x10,8,0\n1,t,free,0x10,8,0\n1,t,free,0x10,8,0\n", 4);
  EXPECT_TRUE(Contains(message, "log.csv:4: free of pointer 0x10, which is not live"));
  EXPECT_TRUE(Contains(message, "last freed on line 3"));
}

TEST(RmmLog, FreeWithWrongSizeIsRejected) {
  const std::string message =
      ParseError(kHeader + "1,t,allocate,0x10,8,0\n1,t,free,0x10,16,0\n", 3);
  EXPECT_TRUE(Contains(message,
                       "log.csv:3: free of pointer 0x10 with size 16, but it was "
                       "allocated with size 8 on line 2"));
}

TEST(RmmLog, AllocationAtLivePointerIsRejected) {
  const std::string message =
      ParseError(kHeader + "1,t,allocate,0x10,8,0\n1,t,allocate,0x10,8,0\n", 3);
  EXPECT_TRUE(Contains(message,
                       "log.csv:3: allocate at pointer 0x10, which is still live "
                       "(allocated on line 2"));
}

TEST(RmmLog, NullPointerWithNonzeroSizeIsRejected) {
  EXPECT_TRUE(Contains(ParseError(kHeader + "1,t,allocate,(nil),8,0\n", 2),
                       "log.csv:2: allocate of 8 bytes at a null pointer"));
}

TEST(RmmLog, TruncatedGzipLogIsRejected) {
  std::ifstream sample(kSampleLog, std::ios::binary);
  const std::string text{std::istreambuf_iterator<char>(sample), std::istreambuf_iterator<char>()};
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("sdalloc_rmm_truncated_" + std::to_string(::getpid()) + ".csv.gz"))
                               .string();
  gzFile file = gzopen(path.c_str(), "wb9");
  ASSERT_NE(file, nullptr);
  ASSERT_EQ(gzwrite(file, text.data(), static_cast<unsigned>(text.size())),
            static_cast<int>(text.size()));
  ASSERT_EQ(gzclose(file), Z_OK);
  std::filesystem::resize_file(path, std::filesystem::file_size(path) / 2);
  try {
    read_rmm_log(path);
    ADD_FAILURE() << "a truncated gzip log was accepted";
  } catch (const TraceFormatError& error) {
    EXPECT_GE(error.line, 1u);
    EXPECT_TRUE(Contains(error.what(), path + ":"));
    EXPECT_TRUE(Contains(error.what(), "truncated gzip file"));
  }
  std::filesystem::remove(path);
}

TEST(RmmLog, MissingFileIsRejected) {
  try {
    read_rmm_log("/nonexistent/sdalloc/rmm.csv");
    FAIL() << "no error for a missing file";
  } catch (const TraceFormatError& error) {
    EXPECT_EQ(error.line, 0u);
    EXPECT_TRUE(Contains(error.what(), "/nonexistent/sdalloc/rmm.csv: cannot open"));
  }
}

}  // namespace
}  // namespace sdalloc
