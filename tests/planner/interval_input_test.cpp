// Issue 15, F7 and F9 for the interval CSV reader (interval_problem.cpp): its lines are
// bounded (an input with no line end fails at 1 MiB instead of growing) and input text in its
// messages is escaped as the trace readers escape it.
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/planner/planner.hpp"
#include "support/test_support.hpp"

namespace sdalloc {
namespace {

using test::Contains;

TEST(IntervalInput, F9_IntervalCsvMessagesAreEscaped) {
  std::istringstream header("id,lower\x1b[0m,upper,size\n");
  try {
    parse_interval_csv(header, "i.csv");
    ADD_FAILURE() << "accepted";
  } catch (const InvalidArgument& error) {
    EXPECT_TRUE(Contains(error.what(), "(got 'id,lower\\x1b[0m,upper,size')")) << error.what();
  }
  std::istringstream field(std::string("id,lower,upper,size\n0,0,1,\0", 27));
  try {
    parse_interval_csv(field, "i.csv");
    ADD_FAILURE() << "accepted";
  } catch (const InvalidArgument& error) {
    EXPECT_TRUE(Contains(error.what(), "bad size '\\x00'")) << error.what();
  }
}

TEST(IntervalInput, F7_IntervalCsvLinesAreBounded) {
  std::istringstream in("id,lower,upper,size\n" + std::string((1 << 20) + 1, '0'));
  try {
    parse_interval_csv(in, "i.csv");
    ADD_FAILURE() << "accepted";
  } catch (const InvalidArgument& error) {
    EXPECT_STREQ(error.what(), "i.csv:2: line is longer than 1048576 bytes");
  }
}

}  // namespace
}  // namespace sdalloc
