// The replay driver (tools/sdalloc/replay/replay_driver.hpp): sdalloc's allocators in process,
// the system allocators in child processes, --capacity and --min-capacity.
#include "replay/replay_driver.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "replay/replay_output.hpp"
#include "replay/system_allocators.hpp"
#include "replay/trace_player.hpp"
#include "sdalloc/core/errors.hpp"
#include "support/test_support.hpp"

namespace sdalloc::replay {
namespace {

using test::Contains;

EventTrace bundled(const std::string& name) {
  return read_event_trace(std::string(SDALLOC_DATA_DIR) + "/traces/" + name);
}

ReplayOptions quiet_options(std::vector<std::string> allocators, int passes) {
  ReplayOptions options;
  options.allocators = std::move(allocators);
  options.passes = passes;
  options.progress = false;
  return options;
}

const AllocatorResult& result_of(const ReplayRun& run, const std::string& name) {
  for (const AllocatorResult& r : run.results) {
    if (r.allocator == name) return r;
  }
  throw std::runtime_error("no result for " + name);
}

TEST(ReplayDriver, PoolAndPlannedOnTheSdTraceStayNearPeakLive) {
  const EventTrace trace = bundled("sd15_unet_b2_64x64_cpu_2pass.csv");
  const ReplayRun run = run_replay(trace, quiet_options({"pool", "planned"}, 3));
  ASSERT_EQ(run.results.size(), 2u);
  EXPECT_EQ(run.peak_live, trace.peak_live_bytes());
  EXPECT_EQ(run.events, trace.events.size());
  const AllocatorResult& pool = result_of(run, "pool");
  const AllocatorResult& planned = result_of(run, "planned");
  ASSERT_TRUE(pool.ran) << pool.problem;
  ASSERT_TRUE(planned.ran) << planned.problem;
  EXPECT_EQ(pool.pass_seconds.size(), 3u);
  EXPECT_GE(pool.peak_reserved, run.peak_live);
  EXPECT_LE(pool.ratio, 1.10);
  // The recording pass takes what is live from the host, then one arena of the plan.
  EXPECT_GE(planned.peak_reserved, run.peak_live);
  EXPECT_LE(planned.ratio, 1.01);
  EXPECT_TRUE(Contains(planned.counters, "divergent steps 0"));
  EXPECT_GT(pool.ns_per_op, 0.0);
  // Samples: in event order; live bytes are the most since the previous sample, so the
  // trace's peak shows in them and nothing above it.
  ASSERT_GT(pool.samples.size(), 3 * kSamplesPerPass / 2);
  std::uint64_t most_live = 0;
  for (std::size_t i = 0; i < pool.samples.size(); ++i) {
    const Sample& s = pool.samples[i];
    if (i > 0) {
      EXPECT_GT(s.event, pool.samples[i - 1].event);
    }
    EXPECT_LE(s.live_bytes, run.peak_live);
    EXPECT_LE(s.reserved_bytes, pool.peak_reserved);
    most_live = std::max(most_live, s.live_bytes);
  }
  EXPECT_EQ(most_live, run.peak_live);
  EXPECT_LT(pool.samples.back().event, 3 * run.events);
}

TEST(ReplayDriver, UnknownAllocatorIsRejectedBeforeAnythingRuns) {
  const EventTrace trace = bundled("torchvision_resnet50_b1_224_cpu_2pass.csv");
  try {
    run_replay(trace, quiet_options({"pool", "nope"}, 1));
    FAIL() << "no exception";
  } catch (const InvalidArgument& error) {
    EXPECT_TRUE(Contains(error.what(), "unknown allocator 'nope'"));
    EXPECT_TRUE(Contains(error.what(), "tcmalloc"));
  }
  EXPECT_THROW(run_replay(trace, quiet_options({"pool"}, 0)), InvalidArgument);
}

TEST(ReplayDriver, TooSmallCapacityIsReportedAsOutOfMemoryForThatAllocatorOnly) {
  const EventTrace trace = bundled("torchvision_resnet50_b1_224_cpu_2pass.csv");
  ReplayOptions options = quiet_options({"pool", "planned"}, 2);
  options.capacity = trace.peak_live_bytes() / 2;
  const ReplayRun run = run_replay(trace, options);
  for (const AllocatorResult& r : run.results) {
    EXPECT_FALSE(r.ran) << r.allocator;
    EXPECT_TRUE(Contains(r.problem, "out of memory")) << r.allocator;
    EXPECT_TRUE(r.samples.empty());
  }
  const nlohmann::json j = to_json(run);
  EXPECT_TRUE(j["results"][0]["peak_reserved"].is_null());
  EXPECT_FALSE(j["results"][0]["problem"].get<std::string>().empty());
}

TEST(ReplayDriver, MinCapacityIsBetweenPeakLiveAndPeakReservedAndReallyFits) {
  const EventTrace trace = bundled("torchvision_resnet50_b1_224_cpu_2pass.csv");
  ReplayOptions options = quiet_options({"pool"}, 2);
  options.min_capacity = true;
  const ReplayRun run = run_replay(trace, options);
  const AllocatorResult& pool = result_of(run, "pool");
  ASSERT_TRUE(pool.ran) << pool.problem;
  ASSERT_TRUE(pool.min_capacity.has_value());
  EXPECT_GE(*pool.min_capacity, run.peak_live);
  EXPECT_LE(*pool.min_capacity, pool.peak_reserved);

  ReplayOptions capped = quiet_options({"pool"}, 2);
  capped.capacity = *pool.min_capacity;
  EXPECT_TRUE(run_replay(trace, capped).results.at(0).ran);
  capped.capacity = run.peak_live - 1;
  EXPECT_FALSE(run_replay(trace, capped).results.at(0).ran);
}

TEST(ReplayDriver, SystemAllocatorMissingLibraryNamesThePackage) {
  const SystemAllocator missing{"nonesuch",
                                "a library that is not installed",
                                {"libnonesuch_malloc.so.9"},
                                "libnonesuch9",
                                "nonesuch_malloc"};
  EXPECT_FALSE(find_preload_library(missing).has_value());
  const AllocatorResult r = run_system_allocator(missing, ChildReplaySettings{}, 1);
  EXPECT_FALSE(r.ran);
  if (!built_with_sanitizer()) {
    EXPECT_TRUE(Contains(r.problem, "apt-get install libnonesuch9"));
  }
}

// The system allocators run in child processes of the real `sdalloc` program, so these go
// through the command line (cli_test.cpp); here: the allocators CI must have.
TEST(ReplayDriver, SystemAllocatorLibrariesAreInstalledInCi) {
  if (std::getenv("CI") == nullptr) GTEST_SKIP() << "only checked in CI (CI is unset)";
  for (const SystemAllocator& a : system_allocators()) {
    EXPECT_TRUE(find_preload_library(a).has_value())
        << a.name << ": scripts/install-deps.sh should install " << a.package;
  }
}

}  // namespace
}  // namespace sdalloc::replay
