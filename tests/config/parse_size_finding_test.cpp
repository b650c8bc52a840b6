// parse_size_finding_test.cpp - what the SDALLOC_CONF fuzzer (tests/fuzz/conf_fuzzer.cpp)
// found in the size parser, kept as tests.
//
// parse_size("nan") (and "capacity:nan" in SDALLOC_CONF) passes NaN through its range check
// (NaN >= 2^63 is false) into a cast to size_t: undefined behaviour, which UBSan reports as
// float-cast-overflow, and an arbitrary size otherwise. parse_size now refuses any number
// that is not finite.
#include <gtest/gtest.h>

#include "config/option_table.hpp"
#include "sdalloc/core/errors.hpp"

namespace sdalloc::config {
namespace {

TEST(ParseSizeFinding, NotANumberIsRefused) {
  EXPECT_THROW(parse_size("nan"), InvalidArgument);
  EXPECT_THROW(parse_size("NaN MiB"), InvalidArgument);
  EXPECT_THROW(parse_size("-nan"), InvalidArgument);
}

TEST(ParseSizeFinding, InfinityIsRefused) { EXPECT_THROW(parse_size("inf"), InvalidArgument); }

}  // namespace
}  // namespace sdalloc::config
