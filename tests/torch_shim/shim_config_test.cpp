// shim_config_test.cpp - the PyTorch shim's SDALLOC_CONF table: its exact messages and
// printed form (which the shim has always had), the table-wide checks, and that
// docs/pytorch.md and include/sdalloc/torch_shim.h document exactly the table's keys.
#include "torch_shim/shim_config.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

#include "config/option_table_checks.hpp"
#include "sdalloc/core/errors.hpp"
#include "support/test_support.hpp"

namespace sdalloc::torch_shim {
namespace {

using test::Contains;

std::string parse_error(std::string_view text) {
  try {
    parse_shim_config(text);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(accepted)";
}

constexpr const char* kDefaults =
    "backend:cuda,mode:auto,capacity:0B,replan_after:3,max_plans:4,granularity:2MiB,"
    "min_segment:2MiB,huge_threshold:8MiB,initial_reservation:0B,release_before_growth:true,"
    "consolidate:true";

TEST(ShimConfig, EveryRowsDefaultTextParsesBackToTheDefault) {
  test::expect_defaults_parse_back(shim_options());
}

TEST(ShimConfig, EveryEnumNameParsesToItsValue) {
  // mode:async needs backend:cuda, the default.
  test::expect_enum_names_parse(shim_options(), "");
}

TEST(ShimConfig, TheDefaultsPrintAsTheyAlwaysHave) {
  EXPECT_EQ(format_shim_config(ShimConfig{}), kDefaults);
  EXPECT_EQ(format_shim_config(parse_shim_config("")), kDefaults);
}

TEST(ShimConfig, EverySettingSurvivesFormatThenParse) {
  const ShimConfig c = parse_shim_config(
      "backend:host,mode:planned,capacity:1GiB,memory_fraction:0.25,replan_after:5,"
      "max_plans:2,granularity:4MiB,initial_reservation:8MiB,release_before_growth:false,"
      "consolidate:false");
  const std::string text = format_shim_config(c);
  EXPECT_EQ(text,
            "backend:host,mode:planned,capacity:1GiB,memory_fraction:0.25,replan_after:5,"
            "max_plans:2,granularity:4MiB,min_segment:4MiB,huge_threshold:8MiB,"
            "initial_reservation:8MiB,release_before_growth:false,consolidate:false");
  const ShimConfig back = parse_shim_config(text);
  EXPECT_EQ(back.backend, Backend::kHost);
  EXPECT_EQ(back.mode, Mode::kPlanned);
  EXPECT_EQ(back.capacity, std::size_t{1} << 30);
  EXPECT_EQ(back.memory_fraction, 0.25);
  EXPECT_EQ(back.replan_after, 5u);
  EXPECT_EQ(back.max_plans, 2u);
  EXPECT_EQ(back.pool.min_segment_size, std::size_t{4} << 20);
  EXPECT_EQ(back.pool.initial_reservation, std::size_t{8} << 20);
  EXPECT_EQ(format_shim_config(back), text);
}

TEST(ShimConfig, KeepsItsMessages) {
  EXPECT_EQ(parse_error("mode:bogus"),
            "SDALLOC_CONF: mode must be auto, pool, async, vmm or planned, in 'mode:bogus'");
  EXPECT_EQ(parse_error("backend:tpu"),
            "SDALLOC_CONF: backend must be cuda or host, in 'backend:tpu'");
  EXPECT_EQ(parse_error("backend:host,backend:cuda"),
            "SDALLOC_CONF: the key 'backend' is repeated, in 'backend:cuda'");
  EXPECT_EQ(parse_error("backend:host,mode"), "SDALLOC_CONF: expected key:value, in 'mode'");
  EXPECT_EQ(parse_error("memory_fraction:2"),
            "SDALLOC_CONF: memory_fraction must be a number in (0, 1], got '2', in "
            "'memory_fraction:2'");
  EXPECT_EQ(parse_error("replan_after:0"),
            "SDALLOC_CONF: expected a whole number >= 1, got '0', in 'replan_after:0'");
  EXPECT_EQ(parse_error("consolidate:maybe"),
            "SDALLOC_CONF: expected true or false, got 'maybe', in 'consolidate:maybe'");
  EXPECT_EQ(parse_error("capcity:1"),
            "SDALLOC_CONF: unknown key 'capcity' (known: backend, mode, capacity, memory_fraction, "
            "replan_after, max_plans, plan_nodes, granularity, min_segment, huge_threshold, "
            "initial_reservation, release_before_growth, consolidate), in 'capcity:1'");
  EXPECT_TRUE(Contains(parse_error("capacity:12XB"), "unknown size unit 'XB'"));
  EXPECT_TRUE(
      Contains(parse_error("granularity:1000"),
               "SDALLOC_CONF: CachingPoolOptions: segment_granularity must be a power of two"));
}

TEST(ShimConfig, ChecksWhatSpansKeys) {
  EXPECT_EQ(parse_error("backend:host,mode:async"),
            "SDALLOC_CONF: mode:async needs backend:cuda (it is cudaMallocAsync)");
  EXPECT_TRUE(Contains(parse_error("backend:host,memory_fraction:0.5"),
                       "memory_fraction with backend:host needs capacity"));
  EXPECT_EQ(parse_shim_config("backend:host,memory_fraction:0.5,capacity:1GiB").memory_fraction,
            0.5);
  // segments is retired: accepted with any value, changing nothing.
  std::vector<std::string> warnings;
  const ShimConfig retired =
      shim_options().parse("backend:host,segments:chunked,mode:planned", &warnings);
  EXPECT_EQ(format_shim_config(retired),
            format_shim_config(parse_shim_config("backend:host,mode:planned")));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_TRUE(Contains(warnings[0], "'segments' no longer has any effect and is ignored"));
  // The cross-key checks come before the pool's own, as they always have.
  EXPECT_TRUE(Contains(parse_error("backend:host,mode:async,granularity:1000"),
                       "mode:async needs backend:cuda"));
}

TEST(ShimConfig, AGranularityRaisesWhatMustBeItsMultiple) {
  const ShimConfig c = parse_shim_config("granularity:256MiB");
  EXPECT_EQ(c.pool.min_segment_size, std::size_t{256} << 20);
  EXPECT_EQ(c.pool.huge_threshold, std::size_t{256} << 20);
}

// =======================================================================================
// The documentation is the table

TEST(ShimConfigDocs, PytorchMdHoldsExactlyTheTable) {
  const std::string doc = test::read_file(SDALLOC_SOURCE_DIR "/docs/pytorch.md");
  EXPECT_EQ(test::generated_key_table(doc),
            std::string("\n").append(shim_options().markdown()).append("\n"))
      << "docs/pytorch.md's key table must be the shim's option table: replace the lines "
         "between its markers (kept apart by a blank line) with the text expected above "
         "(shim_options().markdown()).";
}

TEST(ShimConfigDocs, TheHeaderListsEveryKey) {
  const std::string header = test::read_file(SDALLOC_SOURCE_DIR "/include/sdalloc/torch_shim.h");
  const std::string keys = test::between(header, " * Keys (", " * A malformed SDALLOC_CONF");
  std::set<std::string> listed;  // the words of the list, after the parenthesis
  const std::string list = keys.substr(keys.find("):") + 2);
  for (std::size_t i = 0; i < list.size();) {
    const std::size_t end = list.find_first_not_of("abcdefghijklmnopqrstuvwxyz_", i);
    if (end != i) listed.insert(list.substr(i, end - i));
    i = end == std::string::npos ? list.size() : std::max(end, i + 1);
  }
  for (const auto& row : shim_options().rows()) {
    EXPECT_TRUE(listed.count(std::string(row.spec.key)) == 1) << row.spec.key;
  }
}

}  // namespace
}  // namespace sdalloc::torch_shim
