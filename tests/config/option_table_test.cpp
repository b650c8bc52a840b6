// option_table_test.cpp - the option table over a front end like the planned malloc
// drop-in: the shared pool rows (modes pool, vmm, planned) plus rows of its own (a size, a
// bool, a text). Parsing, each type's bad values, repeated and unknown keys, format/parse
// round trips, the finish hook and the generated documentation.
#include "config/option_table.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config/option_table_checks.hpp"
#include "config/pool_conf.hpp"
#include "sdalloc/core/errors.hpp"
#include "support/test_support.hpp"

namespace sdalloc::config {
namespace {

using test::Contains;

struct MallocConf : PoolConf {
  std::size_t threshold = 64 << 10;
  bool report = false;
  std::string record;
  std::size_t finish_calls = 0;  // what the finish hook saw, for the tests
  bool saw_record = false;
};

std::vector<Option<MallocConf>> malloc_rows() {
  auto rows = lift<MallocConf>(pool_options({kModeAuto, kModePool, kModeVmm, kModePlanned}));
  rows.push_back(size_option<MallocConf>(
      "threshold", "smaller requests go to the pool.",
      [](auto& c) -> auto& { return c.threshold; }));
  rows.push_back(bool_option<MallocConf>(
      "report", "print statistics at exit.", [](auto& c) -> auto& { return c.report; }));
  rows.push_back(text_option<MallocConf>(
      "record", "write an event trace to this file.", [](auto& c) -> auto& { return c.record; }));
  return rows;
}

const OptionTable<MallocConf>& table() {
  static const OptionTable<MallocConf> t("TEST_CONF", malloc_rows(),
                                         [](MallocConf& c, const KeySet& given) {
                                           raise_to_granularity(c, given);
                                           ++c.finish_calls;
                                           c.saw_record = given.contains("record");
                                           validate_pool_conf("TEST_CONF", c);
                                         });
  return t;
}

std::string parse_error(std::string_view text) {
  try {
    table().parse(text);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(accepted)";
}

// =======================================================================================
// Whole-table properties

TEST(OptionTable, EveryRowsDefaultTextParsesBackToTheDefault) {
  test::expect_defaults_parse_back(table());
}

TEST(OptionTable, EveryEnumNameParsesToItsValue) { test::expect_enum_names_parse(table(), ""); }

TEST(OptionTable, ASharedRowAcceptsOnlyTheModesItsFrontEndServes) {
  EXPECT_EQ(parse_error("mode:async"),
            "TEST_CONF: mode must be auto, pool, vmm or planned, in 'mode:async'");
}

// plan_nodes (a count of 0), record (empty text) and the retired keys (no value) are not set
// by default: left out.
TEST(OptionTable, FormatWritesEveryKeyInTableOrderAndLeavesOutUnsetValues) {
  EXPECT_EQ(table().format(MallocConf{}),
            "mode:auto,capacity:0B,replan_after:3,max_plans:4,granularity:2MiB,min_segment:2MiB,"
            "huge_threshold:8MiB,initial_reservation:0B,release_before_growth:true,"
            "consolidate:true,threshold:64KiB,report:false");
}

// Keys that no longer mean anything are accepted with any value, change nothing, and say so
// once each, so scripts written for an older sdalloc keep working.
TEST(OptionTable, ARetiredKeyIsAcceptedIgnoredAndWarnedAbout) {
  std::vector<std::string> warnings;
  const MallocConf c =
      table().parse("spare_pages:false,mode:vmm,cut_free_ends:anything", &warnings);
  EXPECT_EQ(c.mode, PoolMode::kVmm);
  EXPECT_EQ(table().format(c), table().format(table().parse("mode:vmm")));
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_EQ(warnings[0],
            "TEST_CONF: 'spare_pages' no longer has any effect and is ignored (retired in 0.2: "
            "where memory is virtual, vmm moves pages; docs/pools.md)");
  EXPECT_TRUE(Contains(warnings[1], "'cut_free_ends' no longer has any effect"));
  EXPECT_TRUE(Contains(table().markdown(), "| `spare_pages` | any (ignored) | retired in 0.2"));
  // A retired key is still a key: repeating it is an error, as for any other.
  EXPECT_EQ(parse_error("grow_arena:true,grow_arena:false"),
            "TEST_CONF: the key 'grow_arena' is repeated, in 'grow_arena:false'");
}

TEST(OptionTable, EverySettingSurvivesFormatThenParse) {
  const MallocConf c = table().parse(
      "mode:planned,capacity:1GiB,replan_after:7,max_plans:2,plan_nodes:5000,granularity:4MiB,"
      "min_segment:8MiB,"
      "huge_threshold:256MiB,initial_reservation:12MiB,release_before_growth:false,"
      "consolidate:0,threshold:1000,report:True,record:/tmp/a:b.trace");
  const MallocConf back = table().parse(table().format(c));
  EXPECT_EQ(back.mode, PoolMode::kPlanned);
  EXPECT_EQ(back.capacity, std::size_t{1} << 30);
  EXPECT_EQ(back.replan_after, 7u);
  EXPECT_EQ(back.max_plans, 2u);
  EXPECT_EQ(back.plan_nodes, 5000u);
  EXPECT_EQ(back.pool.segment_granularity, std::size_t{4} << 20);
  EXPECT_EQ(back.pool.min_segment_size, std::size_t{8} << 20);
  EXPECT_EQ(back.pool.huge_threshold, std::size_t{256} << 20);
  EXPECT_EQ(back.pool.initial_reservation, std::size_t{12} << 20);
  EXPECT_FALSE(back.pool.release_cached_before_growth);
  EXPECT_FALSE(back.pool.consolidate_when_empty);
  EXPECT_EQ(back.threshold, 1000u);
  EXPECT_TRUE(back.report);
  EXPECT_EQ(back.record, "/tmp/a:b.trace");  // only the first ':' splits a pair
  EXPECT_EQ(table().format(back), table().format(c));
}

TEST(OptionTable, BlanksEmptyPairsAndATrailingCommaAreIgnored) {
  const MallocConf c = table().parse("  mode : vmm ,, capacity:\t2 MiB ,");
  EXPECT_EQ(c.mode, PoolMode::kVmm);
  EXPECT_EQ(c.capacity, std::size_t{2} << 20);
  EXPECT_EQ(table().parse("").capacity, 0u);
  EXPECT_EQ(table().parse(" , ").mode, PoolMode::kAuto);
}

TEST(OptionTable, FinishSeesWhichKeysWereGiven) {
  EXPECT_EQ(table().parse("").finish_calls, 1u);
  EXPECT_FALSE(table().parse("report:true").saw_record);
  EXPECT_TRUE(table().parse("record:x").saw_record);
}

// =======================================================================================
// Pair-level errors

TEST(OptionTable, RejectsAPairWithoutAColon) {
  EXPECT_EQ(parse_error("mode:pool,capacity"), "TEST_CONF: expected key:value, in 'capacity'");
}

TEST(OptionTable, RejectsAnEmptyValue) {
  EXPECT_EQ(parse_error("record: "), "TEST_CONF: the value is empty, in 'record:'");
}

TEST(OptionTable, RejectsARepeatedKey) {
  EXPECT_EQ(parse_error("capacity:1,capacity:1"),
            "TEST_CONF: the key 'capacity' is repeated, in 'capacity:1'");
}

TEST(OptionTable, RejectsAnUnknownKeyListingEveryKnownOne) {
  EXPECT_EQ(parse_error("capcity:1"),
            "TEST_CONF: unknown key 'capcity' (known: mode, capacity, replan_after, max_plans, "
            "plan_nodes, granularity, min_segment, huge_threshold, initial_reservation, "
            "release_before_growth, consolidate, threshold, report, record), in 'capcity:1'");
}

TEST(OptionTable, ThePairsAreCheckedInOrder) {
  EXPECT_EQ(parse_error("capacity:x,mode"), "TEST_CONF: not a size: 'x', in 'capacity:x'");
  EXPECT_EQ(parse_error("mode,capacity:x"), "TEST_CONF: expected key:value, in 'mode'");
}

// =======================================================================================
// Bad values, per type

TEST(OptionTable, RejectsBadSizes) {
  EXPECT_EQ(parse_error("threshold:12XB"),
            "TEST_CONF: unknown size unit 'XB' in '12XB' (use B, KiB, MiB, GiB or TiB), in "
            "'threshold:12XB'");
  EXPECT_EQ(parse_error("capacity:abc"), "TEST_CONF: not a size: 'abc', in 'capacity:abc'");
  EXPECT_EQ(parse_error("capacity:-1"), "TEST_CONF: not a size: '-1', in 'capacity:-1'");
  EXPECT_EQ(parse_error("capacity:9000000TiB"),
            "TEST_CONF: size too large: '9000000TiB', in 'capacity:9000000TiB'");
}

TEST(OptionTable, RejectsCountsBelowOneAndNonIntegers) {
  for (const char* bad : {"0", "x", "1.5", "-2", "3 plans"}) {
    const std::string value = bad;
    EXPECT_EQ(parse_error("max_plans:" + value), "TEST_CONF: expected a whole number >= 1, got '" +
                                                     value + "', in 'max_plans:" + value + "'");
  }
  // A count whose default is 0 ("not set") takes no 0 either: leaving the key out says it.
  EXPECT_EQ(parse_error("plan_nodes:0"),
            "TEST_CONF: expected a whole number >= 1, got '0', in 'plan_nodes:0'");
}

TEST(OptionTable, RejectsAnUnknownEnumName) {
  EXPECT_EQ(parse_error("mode:Pool"),
            "TEST_CONF: mode must be auto, pool, vmm or planned, in 'mode:Pool'");
}

TEST(OptionTable, RejectsBoolsOtherThanTrueAndFalse) {
  EXPECT_EQ(parse_error("report:maybe"),
            "TEST_CONF: expected true or false, got 'maybe', in 'report:maybe'");
  EXPECT_TRUE(table().parse("report:1").report);
  EXPECT_FALSE(table().parse("report:False").report);
}

TEST(OptionTable, ParseValueRejectsFractionsOutsideZeroToOne) {
  const OptionSpec spec{"share", OptionType::kFraction, "", {}};
  for (const char* bad : {"0", "2", "-0.5", "x", "0.5x", "nan"}) {
    SCOPED_TRACE(bad);
    try {
      parse_value(spec, bad);
      ADD_FAILURE() << "accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(std::string(e.what()),
                "share must be a number in (0, 1], got '" + std::string(bad) + "'");
    }
  }
  EXPECT_EQ(parse_value(spec, "1"), OptionValue(1.0));
  EXPECT_EQ(format_value(spec, OptionValue(0.1)), "0.10000000000000001");
  EXPECT_EQ(parse_value(spec, format_value(spec, OptionValue(0.1))), OptionValue(0.1));
}

// =======================================================================================
// Sizes

TEST(OptionTableSizes, ParseSizeTakesBinarySuffixesAndFractions) {
  EXPECT_EQ(parse_size("123"), 123u);
  EXPECT_EQ(parse_size("123B"), 123u);
  EXPECT_EQ(parse_size("4K"), 4096u);
  EXPECT_EQ(parse_size("4KB"), 4096u);
  EXPECT_EQ(parse_size("2MiB"), std::size_t{2} << 20);
  EXPECT_EQ(parse_size(" 1.5 GiB "), std::size_t{3} << 29);
  EXPECT_EQ(parse_size("1T"), std::size_t{1} << 40);
  EXPECT_EQ(parse_size("1.0000001K"), 1024u);  // rounded down to whole bytes
}

TEST(OptionTableSizes, SizeTextUsesTheLargestExactUnit) {
  EXPECT_EQ(size_text(0), "0B");
  EXPECT_EQ(size_text(1000), "1000B");
  EXPECT_EQ(size_text(3 << 10), "3KiB");
  EXPECT_EQ(size_text(std::size_t{3} << 29), "1536MiB");
  EXPECT_EQ(size_text(std::size_t{5} << 50), "5120TiB");
  for (const std::size_t bytes : {std::size_t{0}, std::size_t{1} << 20, std::size_t{12345}}) {
    EXPECT_EQ(parse_size(size_text(bytes)), bytes);
  }
}

// =======================================================================================
// The shared pool rows

TEST(PoolConf, AGranularityAloneRaisesMinSegmentAndHugeThreshold) {
  const MallocConf c = table().parse("granularity:256MiB");
  EXPECT_EQ(c.pool.min_segment_size, std::size_t{256} << 20);
  EXPECT_EQ(c.pool.huge_threshold, std::size_t{256} << 20);
  const MallocConf small = table().parse("granularity:4MiB");
  EXPECT_EQ(small.pool.min_segment_size, std::size_t{4} << 20);
  EXPECT_EQ(small.pool.huge_threshold, std::size_t{8} << 20);  // already a multiple
}

TEST(PoolConf, AGivenMinSegmentIsNotRaisedAndIsChecked) {
  EXPECT_EQ(table().parse("granularity:4MiB,min_segment:8MiB").pool.min_segment_size,
            std::size_t{8} << 20);
  EXPECT_TRUE(Contains(parse_error("granularity:4MiB,min_segment:2MiB"),
                       "TEST_CONF: CachingPoolOptions: min_segment_size must be a positive "
                       "multiple of segment_granularity, got 2097152"));
  EXPECT_TRUE(Contains(parse_error("granularity:4MiB,huge_threshold:2MiB"),
                       "huge_threshold must be at least segment_granularity"));
  EXPECT_TRUE(
      Contains(parse_error("granularity:1000"),
               "TEST_CONF: CachingPoolOptions: segment_granularity must be a power of two"));
}

// =======================================================================================
// Documentation

TEST(OptionTableDocs, MarkdownHasOneLinePerKeyWithTypeHelpAndDefault) {
  const std::string md = table().markdown();
  EXPECT_EQ(md.rfind("| key | values | meaning | default |\n|---|---|---|---|\n", 0), 0u) << md;
  std::size_t lines = 0;
  for (const char c : md) lines += c == '\n' ? 1 : 0;
  EXPECT_EQ(lines, 2 + table().rows().size());
  EXPECT_TRUE(Contains(md, "| `mode` | `auto`, `pool`, `vmm`, `planned` | which pool serves"));
  EXPECT_TRUE(Contains(md, "`vmm`: a VirtualMemoryPool"));
  EXPECT_TRUE(Contains(md, "| `max_plans` | whole number >= 1 | `mode:planned`: plans kept"));
  EXPECT_TRUE(Contains(md, "| `threshold` | size (B, KiB, MiB, GiB, TiB) | smaller"));
  EXPECT_TRUE(Contains(md, "| `64KiB` |\n"));
  EXPECT_TRUE(Contains(md, "| `record` | text | write an event trace to this file. | none |\n"));
  EXPECT_TRUE(Contains(md, "| `report` | `true`, `false` | print statistics at exit. | `false` |"));
}

TEST(OptionTableDocs, HelpListsEveryKeyWithItsDefault) {
  const std::string help = std::string("\n").append(table().help());  // a key starts a line
  for (const auto& row : table().rows()) {
    EXPECT_TRUE(Contains(help, std::string("\n").append(row.spec.key).append(": ")))
        << row.spec.key;
  }
  EXPECT_TRUE(Contains(help,
                       "\nthreshold: size (B, KiB, MiB, GiB, TiB); default 64KiB\n"
                       "    smaller requests go to the pool.\n"));
  EXPECT_TRUE(Contains(help, "\nmode: auto | pool | vmm | planned; default auto\n"));
  EXPECT_TRUE(Contains(help, "\n    planned - a repeated step"));
  EXPECT_TRUE(Contains(help, "\nrecord: text; default none\n"));
}

}  // namespace
}  // namespace sdalloc::config
