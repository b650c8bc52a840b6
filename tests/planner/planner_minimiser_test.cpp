// Tests of plan() without a capacity (the minimiser, sdalloc/planner/planner.hpp): on all
// eleven MiniMalloc "challenging" instances with a short time limit (the 10 s figures are
// measured by `sdalloc plan`, docs/planner.md), and the probes it reports while it runs.
// Limits stay short: the suite also runs under the sanitizers.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/planner/planner.hpp"
#include "support/sanitizers.hpp"

namespace sdalloc {
namespace {

const std::string kDataDir = SDALLOC_DATA_DIR;
// Seconds per instance: 3.3 s for the eleven. The search is 5-15x slower under ASan and
// TSan, so those builds give it 5 s: 0.3 s was not enough there for I and J to beat greedy.
constexpr double kShortLimit = test::kAddressOrThreadSanitizer ? 5.0 : 0.3;
// A deadline may be passed by one look at the clock (every 256 search nodes) and the final
// validation; a generous margin for loaded and sanitized runs.
constexpr double kDeadlineSlack = 0.5;

std::vector<Buffer> instance(const std::string& name) {
  return read_interval_csv(kDataDir + "/minimalloc/" + name + ".1048576.csv");
}

TEST(PlannerMinimiser, BeatsEveryGreedyOrderOnAllElevenMiniMallocInstances) {
  for (const char* name : {"A", "B", "C", "D", "E", "F", "G", "H", "I", "J", "K"}) {
    const std::vector<Buffer> buffers = instance(name);
    const PlanResult greedy = plan(buffers, PlannerOptions{.use_search = false});
    const PlanResult result = plan(buffers, PlannerOptions{.time_limit_seconds = kShortLimit});
    EXPECT_NO_THROW(validate(buffers, result.plan)) << name;
    EXPECT_GE(result.plan.arena_size, result.lower_bound) << name;
    EXPECT_TRUE(result.fits) << name;
    EXPECT_LE(result.seconds, kShortLimit + kDeadlineSlack) << name;
    // The best greedy order is above the bound on every one of them; the search, even in
    // this short a time, brings every one below it.
    ASSERT_GT(greedy.plan.arena_size, greedy.lower_bound) << name;
    EXPECT_LT(result.plan.arena_size, greedy.plan.arena_size) << name;
    EXPECT_EQ(result.method, "search") << name;
    EXPECT_EQ(result.optimal, result.plan.arena_size == result.lower_bound) << name;
  }
}

TEST(PlannerMinimiser, ReachesAReachableBoundByProbingItFirst) {
  // C's bound is reachable, but a bisection that starts half way to the greedy plan does
  // not get there in 10 s; the probe at the bound finds it at once.
  const std::vector<Buffer> buffers = instance("C");
  const PlanResult result = plan(buffers, PlannerOptions{.time_limit_seconds = kShortLimit});
  EXPECT_EQ(result.plan.arena_size, result.lower_bound);
  EXPECT_TRUE(result.optimal);
  EXPECT_FALSE(result.timed_out);
  EXPECT_NO_THROW(validate(buffers, result.plan));
}

TEST(PlannerMinimiser, ReportsTheCapacityItProbes) {
  // D's bound is out of reach in this time: the bound probe (30% of 1.5 s) is followed by
  // bisection probes, each between the bound and the best plan then, and on D's 1 KiB grid
  // (every size is a multiple of 1024, so every arena the search builds is).
  const std::vector<Buffer> buffers = instance("D");
  std::vector<PlanProgress> reports;
  const PlanResult result = plan(
      buffers, PlannerOptions{.time_limit_seconds = 1.5,
                              .progress = [&](const PlanProgress& p) { reports.push_back(p); }});
  ASSERT_FALSE(reports.empty());
  for (const PlanProgress& report : reports) {
    EXPECT_GE(report.probing, result.lower_bound) << report.seconds;
    EXPECT_LT(report.probing, report.best_arena) << report.seconds;
    EXPECT_EQ(report.probing % 1024, 0u) << report.probing;
  }
  const PlanResult with_capacity = plan(
      buffers, PlannerOptions{.capacity = result.lower_bound,
                              .time_limit_seconds = 1.2,
                              .progress = [&](const PlanProgress& p) { reports.push_back(p); }});
  ASSERT_FALSE(with_capacity.fits);
  EXPECT_EQ(reports.back().probing, result.lower_bound);
}

TEST(PlannerMinimiser, HugeSizesPlanWithoutWrapping) {
  // Sizes of 2^59 and 2^60, so the grid of arenas has steps of 2^59 and at most about 30
  // buffers may live at once: the bisection and sweep targets and their step counts are
  // near 2^64 - 1, and greedy misses the bound often enough for the search to run.
  std::mt19937_64 rng(17);
  std::uniform_int_distribution<std::int64_t> start(0, 199);
  std::uniform_int_distribution<std::int64_t> length(1, 40);
  std::uniform_int_distribution<int> shift(59, 60);
  int searched = 0;
  for (int round = 0; round < 8; ++round) {
    std::vector<Buffer> buffers;
    for (std::uint64_t i = 0; i < 80; ++i) {
      const std::int64_t lower = start(rng);
      buffers.push_back(Buffer{.id = i,
                               .lower = lower,
                               .upper = lower + length(rng),
                               .size = std::uint64_t{1} << shift(rng)});
      try {
        lower_bound(buffers);
      } catch (const InvalidArgument&) {
        buffers.pop_back();  // the bytes live at once would pass 2^64 - 1
      }
    }
    const PlanResult result = plan(buffers, PlannerOptions{.time_limit_seconds = 0.2});
    EXPECT_NO_THROW(validate(buffers, result.plan)) << round;
    EXPECT_GE(result.plan.arena_size, result.lower_bound) << round;
    EXPECT_EQ(result.plan.arena_size % (std::uint64_t{1} << 59), 0u) << round;
    if (result.search_nodes > 0) ++searched;
  }
  EXPECT_GT(searched, 0) << "greedy reached the bound every time: the search never ran";
}

TEST(PlannerMinimiser, MiniMallocDScaledNearTwoToThe64PlansWithoutWrapping) {
  // D with every size times 2^43: the bound (about 0.47 x 2^64) is out of reach, so the
  // bisection and the sweeps run, with targets and steps (2^53) near 2^63.
  std::vector<Buffer> buffers = instance("D");
  for (Buffer& b : buffers) b.size <<= 43;
  const PlanResult greedy = plan(buffers, PlannerOptions{.use_search = false});
  const PlanResult result = plan(buffers, PlannerOptions{.time_limit_seconds = 1.0});
  EXPECT_NO_THROW(validate(buffers, result.plan));
  EXPECT_EQ(result.lower_bound, lower_bound(instance("D")) << 43);
  EXPECT_LT(result.plan.arena_size, greedy.plan.arena_size);
  EXPECT_GE(result.plan.arena_size, result.lower_bound);
  EXPECT_EQ(result.plan.arena_size % (std::uint64_t{1} << 53), 0u);
  EXPECT_TRUE(result.timed_out);
}

TEST(PlannerMinimiser, MeetsItsBarOnAllElevenMiniMallocInstancesInFixedNodes) {
  // Issue 16's bar for `sdalloc plan` in 10 s: the lower bound on nine instances, at most
  // 1.045 x it on D and J. Here with node limits instead of the clock (one thread, so the
  // same plans on every machine; about 19 s in all here): the nine reach their bound within
  // 1,000,000 nodes, D reaches 1025024 bytes (1.0395 x) within 300,000 and J 1032192
  // (1.0435 x) within 1,000,000. The static orders alone (no restarts) stayed at 1.0457 x
  // and 1.0466 x in 10 s.
  if (test::kAddressOrThreadSanitizer) {
    GTEST_SKIP() << "a result, not memory safety: minutes under the sanitizers";
  }
  for (const char* name : {"A", "B", "C", "E", "F", "G", "H", "I", "K"}) {
    const std::vector<Buffer> buffers = instance(name);
    const PlanResult result =
        plan(buffers, PlannerOptions{.time_limit_seconds = 600.0, .max_search_nodes = 1000000});
    EXPECT_EQ(result.plan.arena_size, result.lower_bound) << name;
    EXPECT_TRUE(result.optimal) << name;
    EXPECT_NO_THROW(validate(buffers, result.plan)) << name;
  }
  for (const auto& [name, nodes] : {std::pair{"D", 300000U}, std::pair{"J", 1000000U}}) {
    const std::vector<Buffer> buffers = instance(name);
    const PlanResult result =
        plan(buffers, PlannerOptions{.time_limit_seconds = 600.0, .max_search_nodes = nodes});
    EXPECT_NO_THROW(validate(buffers, result.plan)) << name;
    EXPECT_LE(static_cast<double>(result.plan.arena_size),
              1.045 * static_cast<double>(result.lower_bound))
        << name << ": " << result.plan.arena_size;
    EXPECT_LE(result.search_nodes, nodes) << name;
  }
}

TEST(PlannerMinimiser, ThreadsSweepBesideTheBisectionAndShareOneBestPlan) {
  // Two and four threads (more than this machine has cores: they take turns) on D and J,
  // whose bounds are out of reach, so every phase runs and the threads cancel each other's
  // probes as plans are found. The progress reports (about once a second, hence the limit)
  // come one at a time from whichever thread is searching (TSan runs this suite).
  const double limit = std::max(1.3, kShortLimit);
  for (const auto& [name, threads] : {std::pair{"D", 2U}, std::pair{"D", 4U}, std::pair{"J", 2U}}) {
    const std::vector<Buffer> buffers = instance(name);
    const PlanResult greedy = plan(buffers, PlannerOptions{.use_search = false});
    std::atomic<int> reports{0};
    std::atomic<int> inside{0};
    std::atomic<bool> overlapped{false};
    const auto report = [&](const PlanProgress& p) {
      if (inside.fetch_add(1) != 0) overlapped = true;
      EXPECT_LT(p.probing, p.best_arena);
      reports.fetch_add(1);
      inside.fetch_sub(1);
    };
    const PlanResult result =
        plan(buffers,
             PlannerOptions{.time_limit_seconds = limit, .threads = threads, .progress = report});
    EXPECT_NO_THROW(validate(buffers, result.plan)) << name << threads;
    EXPECT_LT(result.plan.arena_size, greedy.plan.arena_size) << name << threads;
    EXPECT_EQ(result.method, "search") << name << threads;
    EXPECT_TRUE(result.timed_out) << name << threads;
    EXPECT_FALSE(result.optimal) << name << threads;
    EXPECT_LE(result.seconds, limit + kDeadlineSlack) << name << threads;
    EXPECT_GT(reports.load(), 0) << name << threads;
    EXPECT_FALSE(overlapped.load()) << name << threads;
  }
}

TEST(PlannerMinimiser, ThreadsStopAtOnceWhenTheBoundIsReached) {
  // C's bound is found by the first probe; the sweeping threads must not keep the call
  // running to its time limit.
  const std::vector<Buffer> buffers = instance("C");
  const PlanResult result = plan(buffers, PlannerOptions{.time_limit_seconds = 30.0, .threads = 3});
  EXPECT_EQ(result.plan.arena_size, result.lower_bound);
  EXPECT_EQ(result.method, "search");  // greedy does not reach it: the threads ran
  EXPECT_TRUE(result.optimal);
  EXPECT_LT(result.seconds, 10.0);
}

TEST(PlannerMinimiser, ANodeLimitKeepsOneThreadAndOneAnswer) {
  // A node limit is there for the same plan on every run: threads do not change that.
  const std::vector<Buffer> buffers = instance("D");
  const PlannerOptions options{.time_limit_seconds = 60.0, .max_search_nodes = 10000, .threads = 4};
  const PlanResult first = plan(buffers, options);
  const PlanResult again = plan(buffers, options);
  EXPECT_EQ(first.plan.offsets, again.plan.offsets);
  EXPECT_EQ(first.search_nodes, again.search_nodes);
  EXPECT_LE(first.search_nodes, 10000u);
}

}  // namespace
}  // namespace sdalloc
