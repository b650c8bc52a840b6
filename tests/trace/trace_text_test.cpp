// TraceFormatError, declared with the byte reader (trace_text.hpp) below every format: its
// message forms, its fields, and that it is still caught as the InvalidArgument it was.
#include "sdalloc/trace/trace_text.hpp"

#include <gtest/gtest.h>

#include <string>

#include "sdalloc/core/errors.hpp"

namespace sdalloc {
namespace {

TEST(TraceFormatErrorTest, NamesSourceAndLine) {
  const TraceFormatError error("t.csv", 3, "bad thing");
  EXPECT_STREQ(error.what(), "t.csv:3: bad thing");
  EXPECT_EQ(error.source, "t.csv");
  EXPECT_EQ(error.line, 3u);
}

TEST(TraceFormatErrorTest, LineZeroLeavesTheLineOut) {
  const TraceFormatError error("t.csv", 0, "cannot open: No such file or directory");
  EXPECT_STREQ(error.what(), "t.csv: cannot open: No such file or directory");
  EXPECT_EQ(error.line, 0u);
}

TEST(TraceFormatErrorTest, IsAnInvalidArgument) {
  try {
    throw TraceFormatError("t.csv", 1, "x");
  } catch (const InvalidArgument& error) {
    EXPECT_STREQ(error.what(), "t.csv:1: x");
    return;
  }
  ADD_FAILURE() << "not caught as InvalidArgument";
}

TEST(TraceTextTest, MissingFileIsATraceFormatErrorOnLineZero) {
  try {
    read_trace_text("/nonexistent/sdalloc/trace.csv");
    ADD_FAILURE() << "read a file that does not exist";
  } catch (const TraceFormatError& error) {
    EXPECT_EQ(error.line, 0u);
    EXPECT_EQ(error.source, "/nonexistent/sdalloc/trace.csv");
    EXPECT_NE(std::string(error.what()).find(": cannot open: "), std::string::npos);
  }
}

}  // namespace
}  // namespace sdalloc
