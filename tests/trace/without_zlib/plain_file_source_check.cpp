// plain_file_source_check.cpp - the trace readers of a build without zlib
// (src/trace/file_sources/plain_file_source.cpp, linked here in place of the gzip source the
// library was built with): plain traces read exactly as through zlib, a gzip-compressed one
// is refused with a message that names the cause, a missing file is a "cannot open".
// Its own binary (sdalloc_without_zlib_test), so the main suite keeps the zlib reader.
#include <gtest/gtest.h>

#include <string>

#include "sdalloc/trace/event_trace.hpp"
#include "support/test_support.hpp"

namespace sdalloc::test {
namespace {

const std::string kTrace = SDALLOC_DATA_DIR "/traces/torchvision_resnet50_b1_224_cpu_2pass.csv";

TEST(WithoutZlib, PlainTracesReadAsTheyAre) {
  const EventTrace trace = read_event_trace(kTrace);
  EXPECT_EQ(trace.events.size(), 1524u);  // the trace's stats.json: 762 allocations, 2 passes
  EXPECT_EQ(trace.allocation_count(), 762u);
  EXPECT_EQ(trace.peak_live_bytes(), 11763840u);
}

TEST(WithoutZlib, GzipInputIsRefusedByName) {
  TempDir dir;
  write_gzip(dir.file("t.csv.gz"), read_file(kTrace));
  try {
    (void)read_event_trace(dir.file("t.csv.gz"));
    ADD_FAILURE() << "a gzip trace was read without zlib";
  } catch (const TraceFormatError& e) {
    EXPECT_NE(std::string(e.what()).find("built without zlib"), std::string::npos) << e.what();
  }
}

TEST(WithoutZlib, AMissingFileCannotBeOpened) {
  TempDir dir;
  try {
    (void)read_event_trace(dir.file("absent.csv"));
    ADD_FAILURE() << "a missing file was read";
  } catch (const TraceFormatError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace sdalloc::test
