// preload_config_test.cpp - the drop-in's SDALLOC_CONF table: its own keys, the modes it
// serves, its messages, and that docs/preload.md holds exactly the table.
#include "preload/preload_config.hpp"

#include <gtest/gtest.h>

#include <string>

#include "config/option_table_checks.hpp"
#include "sdalloc/core/errors.hpp"
#include "support/test_support.hpp"

namespace sdalloc::preload {
namespace {

std::string parse_error(std::string_view text) {
  try {
    parse_preload_config(text);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(accepted)";
}

// mode:auto: the reserved range's pages can be mapped one by one, so the drop-in's pool is a
// VirtualMemoryPool (make_pool resolves it).
TEST(PreloadConfig, DefaultsAreTheMeasuredThresholdAndTheAutomaticMode) {
  const PreloadConfig c = parse_preload_config("");
  EXPECT_EQ(c.mode, Mode::kAuto);
  EXPECT_EQ(c.threshold, kDefaultThreshold);
  EXPECT_EQ(c.address_space, kDefaultAddressSpace);
  EXPECT_TRUE(c.report.empty());
  EXPECT_TRUE(c.record.empty());
  EXPECT_FALSE(c.huge_pages);
  EXPECT_TRUE(c.keep_system_heap);
  test::expect_defaults_parse_back(preload_options());
}

TEST(PreloadConfig, ParsesItsOwnKeys) {
  const PreloadConfig c = parse_preload_config(
      "mode:planned,threshold:256KiB,address_space:64GiB,report:stderr,record:/tmp/t.csv");
  EXPECT_EQ(c.mode, Mode::kPlanned);
  EXPECT_EQ(c.threshold, std::size_t{256} << 10);
  EXPECT_EQ(c.address_space, std::size_t{64} << 30);
  EXPECT_EQ(c.report, "stderr");
  EXPECT_EQ(c.record, "/tmp/t.csv");
  EXPECT_EQ(parse_preload_config(format_preload_config(c)).record, "/tmp/t.csv");
  EXPECT_EQ(parse_preload_config("mode:vmm").mode, Mode::kVmm);
  EXPECT_TRUE(parse_preload_config("huge_pages:true").huge_pages);
  EXPECT_FALSE(parse_preload_config("keep_system_heap:false").keep_system_heap);
  EXPECT_TRUE(parse_preload_config("").vmm_moves);
  EXPECT_FALSE(parse_preload_config("vmm_moves:false").vmm_moves);
}

TEST(PreloadConfig, PathsNameTheirProcessWherePercentPSaysSo) {
  EXPECT_EQ(path_for_process("/tmp/report-%p.json", 4321), "/tmp/report-4321.json");
  EXPECT_EQ(path_for_process("%p/%p", 7), "7/7");
  EXPECT_EQ(path_for_process("/tmp/100%%-%p", 7), "/tmp/100%-7");
  EXPECT_EQ(path_for_process("/tmp/50%-done%", 7), "/tmp/50%-done%");  // other % stay
  EXPECT_EQ(path_for_process("stderr", 7), "stderr");
  EXPECT_EQ(path_for_process("", 7), "");
  EXPECT_EQ(parse_preload_config("report:/tmp/r-%p.txt").report, "/tmp/r-%p.txt");
}

TEST(PreloadConfig, RejectsWhatTheDropInCannotServe) {
  EXPECT_EQ(parse_error("mode:async"),
            "SDALLOC_CONF: mode must be auto, pool, vmm or planned, in 'mode:async'");
  EXPECT_EQ(parse_error("backend:host"),
            "SDALLOC_CONF: unknown key 'backend' (known: mode, threshold, address_space, report, "
            "record, huge_pages, keep_system_heap, vmm_moves, capacity, replan_after, max_plans, "
            "plan_nodes, granularity, min_segment, huge_threshold, initial_reservation, "
            "release_before_growth, consolidate), in 'backend:host'");
  EXPECT_EQ(parse_error("threshold:1KiB"),
            "SDALLOC_CONF: threshold must be at least 4KiB (the pool is not a small-object "
            "allocator), not 1KiB");
  EXPECT_EQ(parse_error("address_space:1MiB"),
            "SDALLOC_CONF: address_space must be at least 1GiB, not 1MiB");
  EXPECT_EQ(parse_error("address_space:2GiB,capacity:4GiB"),
            "SDALLOC_CONF: capacity 4GiB exceeds address_space 2GiB");
  EXPECT_EQ(parse_error("threshold:lots"), "SDALLOC_CONF: not a size: 'lots', in 'threshold:lots'");
}

TEST(PreloadConfigDocs, PreloadMdHoldsExactlyTheTable) {
  const std::string doc = test::read_file(SDALLOC_SOURCE_DIR "/docs/preload.md");
  EXPECT_EQ(test::generated_key_table(doc),
            std::string("\n").append(preload_options().markdown()).append("\n"))
      << "docs/preload.md's key table must be the drop-in's option table: replace the lines "
         "between its markers (kept apart by a blank line) with the text expected above "
         "(preload_options().markdown()).";
}

}  // namespace
}  // namespace sdalloc::preload
