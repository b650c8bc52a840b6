// Issue 15, F9: input bytes reach error messages escaped (trace/quoted.hpp): control bytes,
// C1 controls, bidirectional overrides and bytes that are not UTF-8 as \xNN, long text cut
// with "...", and well-formed text unchanged; every parser's messages go through it.
#include <gtest/gtest.h>

#include <cstring>
#include <sstream>
#include <string>

#include "sdalloc/trace/event_trace.hpp"
#include "sdalloc/trace/rmm_log.hpp"
#include "support/test_support.hpp"
#include "trace/quoted.hpp"

namespace sdalloc {
namespace {

using detail::escaped;
using test::Contains;

TEST(EscapedInput, PrintableAsciiAndUtf8StayAsTheyAre) {
  EXPECT_EQ(escaped("op,id,size"), "op,id,size");
  EXPECT_EQ(escaped("gr\xc3\xb6\xc3\x9f"
                    "e \xe2\x82\xac \xf0\x9f\x98\x80"),
            "gr\xc3\xb6\xc3\x9f"
            "e \xe2\x82\xac \xf0\x9f\x98\x80");
  EXPECT_EQ(detail::quoted("x"), "'x'");
}

TEST(EscapedInput, F9_ControlBytesAndBadUtf8AreEscaped) {
  EXPECT_EQ(escaped(std::string("a\0b", 3)), "a\\x00b");
  EXPECT_EQ(escaped("\x1b[31mred\x07\x7f\t\r\n"), "\\x1b[31mred\\x07\\x7f\\x09\\x0d\\x0a");
  EXPECT_EQ(escaped("\xff\xfe"), "\\xff\\xfe");           // never UTF-8
  EXPECT_EQ(escaped("\xc0\xaf"), "\\xc0\\xaf");           // overlong '/'
  EXPECT_EQ(escaped("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a surrogate
  EXPECT_EQ(escaped("\xe2\x82"), "\\xe2\\x82");           // cut short
  EXPECT_EQ(escaped("\xc2\x9b"
                    "2J"),
            "\\xc2\\x9b2J");  // C1 CSI
  EXPECT_EQ(escaped("a\xe2\x80\xae"
                    "b"),
            "a\\xe2\\x80\\xaeb");  // right-to-left override
}

TEST(EscapedInput, F9_LongTextIsCutWithAnEllipsis) {
  EXPECT_EQ(escaped(std::string(500, 'x')), std::string(detail::kShownBytes, 'x') + "...");
  EXPECT_EQ(escaped(std::string(10, 'x'), 4), "xxxx...");
  EXPECT_EQ(escaped(std::string(500, 'x'), detail::kUnlimited), std::string(500, 'x'));
}

TEST(EscapedInput, EscapingTwiceChangesNothing) {
  const std::string once = escaped(std::string("\0\x1b\xff\xc2\x9b ok", 8), detail::kUnlimited);
  EXPECT_EQ(escaped(once, detail::kUnlimited), once);
}

// The message of the TraceFormatError that parsing `text` as an event trace throws.
std::string event_trace_error(const std::string& text) {
  std::istringstream in(text);
  try {
    parse_event_trace(in, "t.csv");
  } catch (const TraceFormatError& error) {
    return error.what();
  }
  ADD_FAILURE() << "accepted";
  return "";
}

TEST(EscapedInput, F9_NulAndEscapesInATraceReachTheMessageEscaped) {
  const std::string message =
      event_trace_error(std::string("op,id,size\na,0,1\n\x1b[2J\0zz,1,2\n", 29));
  EXPECT_EQ(message, "t.csv:3: unknown op '\\x1b[2J\\x00zz' (expected 'a' or 'f')");
  EXPECT_EQ(std::strlen(message.c_str()), message.size());  // no NUL cuts it short
  const std::string header = event_trace_error(
      "\x9b"
      "31m,id,size\n");
  EXPECT_TRUE(Contains(header, "bad header '\\x9b31m,id,size'")) << header;
  const std::string field = event_trace_error("op,id,size\na,0,1\x1b\n");
  EXPECT_TRUE(Contains(field, "size '1\\x1b' is not a non-negative integer")) << field;
  const std::string long_line = event_trace_error("op,id,size\na,0," + std::string(5000, '9'));
  EXPECT_LT(long_line.size(), 400u);
  EXPECT_TRUE(Contains(long_line, "...' is too large")) << long_line;
}

TEST(EscapedInput, F9_RmmLogMessagesAreEscaped) {
  const std::string log = std::string(kRmmLogHeader) + "\n1,2,allocate\x1b]0;x\x07,0x10,16,0\n";
  try {
    parse_rmm_log(log, "log.csv");
    ADD_FAILURE() << "accepted";
  } catch (const TraceFormatError& error) {
    EXPECT_TRUE(Contains(error.what(), "unknown action 'allocate\\x1b]0;x\\x07'")) << error.what();
  }
}

TEST(EscapedInput, F9_FileNamesInMessagesAreEscapedButKeptInTheError) {
  const TraceFormatError error(std::string("a\0b.csv", 7), 2, "bad \x1b");
  EXPECT_STREQ(error.what(), "a\\x00b.csv:2: bad \\x1b");
  EXPECT_EQ(error.source, std::string("a\0b.csv", 7));
}

}  // namespace
}  // namespace sdalloc
