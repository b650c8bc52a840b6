// read_any_trace: picks the event-trace or RMM-log reader from the content (plain, gzip or
// standard input), and rejects pickles, zip archives and unknown text with a clear message.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "sdalloc/trace/rmm_log.hpp"
#include "sdalloc/trace/trace_input.hpp"
#include "support/test_support.hpp"

namespace sdalloc {
namespace {

using test::Contains;
using test::read_file;
using test::TempDir;
using test::write_file;
using test::write_gzip;

const std::string kSampleLog = std::string(SDALLOC_DATA_DIR) + "/samples/rmm_log_sample.csv";

// The TraceFormatError read_any_trace(path) throws; fails the test if none.
TraceFormatError ReadError(const std::string& path) {
  try {
    read_any_trace(path);
  } catch (const TraceFormatError& error) {
    return error;
  }
  ADD_FAILURE() << "no TraceFormatError for " << path;
  return TraceFormatError(path, 0, "none");
}

TEST(TraceInput, EventTraceIsReadAsEventTrace) {
  TempDir dir;
  const std::string path = dir.file("trace.csv");
  write_file(path, "op,id,size,stream\na,0,4096,0\na,1,100,2\nf,0,4096,1\n");
  const TraceInput input = read_trace_input(path);
  EXPECT_EQ(input.format, TraceFormat::kEventTrace);
  EXPECT_TRUE(input.notes.empty());
  EXPECT_EQ(input.trace.source, path);
  ASSERT_EQ(input.trace.events.size(), 3u);
  EXPECT_EQ(input.trace.events[1].stream, 2u);
  EXPECT_EQ(input.trace.peak_live_bytes(), 4196u);
}

TEST(TraceInput, RmmLogIsReadAsRmmLogWithNotes) {
  const TraceInput input = read_trace_input(kSampleLog);
  EXPECT_EQ(input.format, TraceFormat::kRmmLog);
  EXPECT_EQ(input.trace.events.size(), 9u);
  EXPECT_EQ(input.trace.peak_live_bytes(), 4194816u);
  ASSERT_EQ(input.notes.size(), 3u);
  EXPECT_TRUE(Contains(input.notes[0], "1 'allocate failure' line(s) skipped"));
  EXPECT_TRUE(Contains(input.notes[1], "2 allocate/free call(s) of 0 bytes"));
  EXPECT_TRUE(Contains(input.notes[2], "0 = 0x0, 1 = 0x55d0c3a1e0b0"));
}

TEST(TraceInput, ReadAnyTraceGivesTheSameEventsAsTheFormatsOwnReader) {
  const EventTrace any = read_any_trace(kSampleLog);
  const RmmLog own = read_rmm_log(kSampleLog);
  ASSERT_EQ(any.events.size(), own.trace.events.size());
  for (std::size_t i = 0; i < any.events.size(); ++i) {
    EXPECT_EQ(any.events[i].op, own.trace.events[i].op);
    EXPECT_EQ(any.events[i].id, own.trace.events[i].id);
    EXPECT_EQ(any.events[i].size, own.trace.events[i].size);
    EXPECT_EQ(any.events[i].stream, own.trace.events[i].stream);
  }
}

TEST(TraceInput, GzipFilesOfBothFormatsAreRead) {
  TempDir dir;
  const std::string log = dir.file("rmm.csv.gz");
  write_gzip(log, read_file(kSampleLog));
  const TraceInput rmm = read_trace_input(log);
  EXPECT_EQ(rmm.format, TraceFormat::kRmmLog);
  EXPECT_EQ(rmm.trace.peak_live_bytes(), 4194816u);

  const std::string trace = dir.file("trace.gz");
  write_gzip(trace, "op,id,size\na,0,10\nf,0,10\n");
  const TraceInput events = read_trace_input(trace);
  EXPECT_EQ(events.format, TraceFormat::kEventTrace);
  EXPECT_EQ(events.trace.events.size(), 2u);
}

TEST(TraceInput, TruncatedGzipIsRejected) {
  TempDir dir;
  const std::string whole = dir.file("whole.csv.gz");
  write_gzip(whole, read_file(kSampleLog));
  const std::string bytes = read_file(whole);
  for (const std::size_t keep : {bytes.size() / 2, bytes.size() - 4}) {
    const std::string path = dir.file("cut.csv.gz");
    write_file(path, bytes.substr(0, keep));
    const TraceFormatError error = ReadError(path);
    EXPECT_GE(error.line, 1u);
    EXPECT_TRUE(Contains(error.what(), path + ":"));
    EXPECT_TRUE(Contains(error.what(), "truncated gzip file")) << "kept " << keep << " bytes";
  }
}

TEST(TraceInput, StandardInputIsRead) {
  TempDir dir;
  const std::string path = dir.file("stdin.csv");
  write_file(path, read_file(kSampleLog));
  const int saved = ::dup(STDIN_FILENO);
  ASSERT_GE(saved, 0);
  const int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::dup2(fd, STDIN_FILENO), STDIN_FILENO);
  ::close(fd);
  TraceInput input;
  try {
    input = read_trace_input("-");
  } catch (...) {
    ::dup2(saved, STDIN_FILENO);
    ::close(saved);
    throw;
  }
  ::dup2(saved, STDIN_FILENO);
  ::close(saved);
  EXPECT_EQ(input.format, TraceFormat::kRmmLog);
  EXPECT_EQ(input.trace.source, "<stdin>");
  EXPECT_EQ(input.trace.events.size(), 9u);
}

TEST(TraceInput, PickleIsRejectedWithTheConverterToRun) {
  TempDir dir;
  const std::string path = dir.file("snapshot.pickle");
  // What pickle.dump writes first with protocol 4 (Python's default): PROTO 4, FRAME.
  write_file(path, std::string("\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00}\x94.", 14));
  const TraceFormatError error = ReadError(path);
  EXPECT_EQ(error.line, 1u);
  EXPECT_TRUE(Contains(error.what(), "PyTorch memory snapshot"));
  EXPECT_TRUE(Contains(error.what(), "tools/torch_snapshot_to_trace.py"));
}

TEST(TraceInput, GzippedPickleIsRejectedToo) {
  TempDir dir;
  const std::string path = dir.file("snapshot.pickle.gz");
  write_gzip(path, std::string("\x80\x02}q\x00.", 6));
  EXPECT_TRUE(Contains(ReadError(path).what(), "tools/torch_snapshot_to_trace.py"));
}

TEST(TraceInput, ZipArchiveIsRejected) {
  TempDir dir;
  const std::string path = dir.file("model.pt");
  write_file(path, std::string("PK\x03\x04\x14\x00\x00\x00", 8));
  EXPECT_TRUE(Contains(ReadError(path).what(), "zip archive"));
}

TEST(TraceInput, UnknownHeaderIsRejectedNamingIt) {
  TempDir dir;
  const std::string path = dir.file("other.csv");
  write_file(path, "time,bytes\n1,2\n");
  const TraceFormatError error = ReadError(path);
  EXPECT_EQ(error.line, 1u);
  EXPECT_TRUE(Contains(error.what(), path + ":1: unrecognised trace format: first line is "
                                            "'time,bytes'"));
  EXPECT_TRUE(Contains(error.what(), "'Thread,Time,Action,Pointer,Size,Stream'"));
}

TEST(TraceInput, BinaryDataIsNotEchoed) {
  TempDir dir;
  const std::string path = dir.file("random.bin");
  write_file(path, std::string("\x01\x02\xff\xfe\x00\x10", 6));
  EXPECT_TRUE(Contains(ReadError(path).what(), "first line is binary data"));
}

TEST(TraceInput, EmptyFileIsRejected) {
  TempDir dir;
  const std::string path = dir.file("empty.csv");
  write_file(path, "");
  EXPECT_TRUE(Contains(ReadError(path).what(), path + ":1: empty file"));
}

TEST(TraceInput, MissingFileIsRejected) {
  const TraceFormatError error = ReadError("/nonexistent/sdalloc/trace.csv");
  EXPECT_EQ(error.line, 0u);
  EXPECT_TRUE(Contains(error.what(), "/nonexistent/sdalloc/trace.csv: cannot open"));
}

TEST(TraceInput, ErrorsOfTheChosenReaderNameFileAndLine) {
  TempDir dir;
  const std::string log = dir.file("rmm.csv");
  write_file(log, "Thread,Time,Action,Pointer,Size,Stream\n1,t,free,0x10,8,0\n");
  EXPECT_TRUE(Contains(ReadError(log).what(), log + ":2: free of pointer 0x10"));

  const std::string trace = dir.file("trace.csv");
  write_file(trace, "op,id,size\na,0,8\nf,0,9\n");
  EXPECT_TRUE(Contains(ReadError(trace).what(), trace + ":3: free of id 0 with size 9"));
}

TEST(TraceInput, FormatNamesAreReadable) {
  EXPECT_STREQ(trace_format_name(TraceFormat::kEventTrace), "event trace");
  EXPECT_STREQ(trace_format_name(TraceFormat::kRmmLog), "RMM log");
}

}  // namespace
}  // namespace sdalloc
