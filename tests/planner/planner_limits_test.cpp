// Regression tests of the planner at its limits (issue 15, findings F1, F2, F5, F6): times
// near the int64 range, offsets and sizes near 2^64, long schedules, time limits from
// zero to absurd, and the node limit. Each test is named after the finding it replays.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/planner/planner.hpp"

namespace sdalloc {
namespace {

constexpr std::uint64_t kMax64 = std::numeric_limits<std::uint64_t>::max();

// n tiny buffers, each freed before the next is allocated: [2i, 2i + 1).
std::vector<Buffer> alloc_free_pairs(std::size_t n) {
  std::vector<Buffer> buffers;
  buffers.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto t = static_cast<std::int64_t>(2 * i);
    buffers.push_back(Buffer{.id = i, .lower = t, .upper = t + 1, .size = 64 + (i % 7) * 64});
  }
  return buffers;
}

// Random overlapping buffers: hard enough that the search runs out any short budget.
std::vector<Buffer> tangled_buffers(std::size_t count) {
  std::mt19937_64 rng(11);
  std::uniform_int_distribution<std::int64_t> time(0, 399);
  std::uniform_int_distribution<std::uint64_t> size(1, 100000);
  std::vector<Buffer> buffers;
  for (std::size_t i = 0; i < count; ++i) {
    std::int64_t a = time(rng);
    std::int64_t b = time(rng);
    if (a > b) std::swap(a, b);
    buffers.push_back(Buffer{.id = i, .lower = a, .upper = b + 1, .size = size(rng)});
  }
  return buffers;
}

// ---- F1: times beyond +-2^62 ------------------------------------------------------------

TEST(PlannerLimits, F1_TimesBeyondTwoToThe62AreRejectedByTheParser) {
  for (const char* line : {"0,-4611686018427387905,0,8", "0,0,4611686018427387905,8",
                           "0,-9223372036854775808,9223372036854775807,8"}) {
    std::istringstream text(std::string("id,lower,upper,size\n") + line + "\n");
    try {
      parse_interval_csv(text, "far.csv");
      ADD_FAILURE() << line << " was accepted";
    } catch (const InvalidArgument& error) {
      EXPECT_NE(std::string(error.what()).find("far.csv:2:"), std::string::npos) << error.what();
      EXPECT_NE(std::string(error.what()).find("2^62"), std::string::npos) << error.what();
    }
  }
  const std::vector<Buffer> far = {
      {.id = 1, .lower = std::numeric_limits<std::int64_t>::min(), .upper = 0, .size = 8}};
  EXPECT_THROW(check_buffers(far), InvalidArgument);
  EXPECT_THROW(plan(far), InvalidArgument);
}

TEST(PlannerLimits, F1_TimesAtTwoToThe62PlanExactly) {
  // The probe's reproducer, at the edge of the range now allowed: the lower bound is the
  // 200 bytes live together, not a wrapped sum, and the plan is valid.
  std::istringstream text(
      "id,lower,upper,size\n"
      "0,-4611686018427387904,4611686018427387904,100\n"
      "1,-4611686018427387904,4611686018427387904,100\n"
      "2,4611686018427387903,4611686018427387904,50\n");
  const std::vector<Buffer> buffers = parse_interval_csv(text, "edge.csv");
  EXPECT_EQ(lower_bound(buffers), 250u);
  const PlanResult result = plan(buffers, PlannerOptions{.time_limit_seconds = 1.0});
  EXPECT_EQ(result.plan.arena_size, 250u);
  EXPECT_TRUE(result.optimal);
  EXPECT_NO_THROW(validate(buffers, result.plan));
  for (const GreedyOrder order :
       {GreedyOrder::kSize, GreedyOrder::kLifetime, GreedyOrder::kArea, GreedyOrder::kBestFit}) {
    EXPECT_EQ(plan_greedy(buffers, order).arena_size, 250u);
  }
}

// ---- F2: offsets and sizes that wrap past 2^64 -------------------------------------------

TEST(PlannerLimits, F2_ValidateRejectsOffsetsThatWrapAround) {
  // Live together, both at 2^64 - 1: offset + size wraps to 0, which made them look disjoint.
  const std::vector<Buffer> buffers = {{.id = 1, .lower = 0, .upper = 10, .size = 1},
                                       {.id = 2, .lower = 0, .upper = 10, .size = 1}};
  const Plan wrapped{.offsets = {kMax64, kMax64}, .arena_size = 0};
  EXPECT_THROW(validate(buffers, wrapped), InvalidArgument);
  // One wraps past 2^64 onto the other's bytes.
  const std::vector<Buffer> near_top = {{.id = 1, .lower = 0, .upper = 5, .size = 1},
                                        {.id = 2, .lower = 0, .upper = 5, .size = 8}};
  const Plan wrapped_onto{.offsets = {0, kMax64 - 3}, .arena_size = 4};
  EXPECT_THROW(validate(near_top, wrapped_onto), InvalidArgument);
}

TEST(PlannerLimits, F2_SizesThatCannotFitBelowTwoToThe64AreTypedErrors) {
  const std::uint64_t half = std::uint64_t{1} << 63;
  const std::vector<Buffer> together = {{.id = 1, .lower = 0, .upper = 10, .size = half},
                                        {.id = 2, .lower = 5, .upper = 15, .size = half}};
  EXPECT_THROW(lower_bound(together), InvalidArgument);  // the running sum would wrap
  EXPECT_THROW(plan(together), InvalidArgument);
  for (const GreedyOrder order :
       {GreedyOrder::kSize, GreedyOrder::kLifetime, GreedyOrder::kArea, GreedyOrder::kBestFit}) {
    EXPECT_THROW(plan_greedy(together, order), InvalidArgument);  // offset + size would wrap
  }
  // Apart in time they share offset 0, and each fits.
  const std::vector<Buffer> apart = {{.id = 1, .lower = 0, .upper = 10, .size = kMax64},
                                     {.id = 2, .lower = 10, .upper = 15, .size = kMax64}};
  const PlanResult result = plan(apart);
  EXPECT_EQ(result.plan.arena_size, kMax64);
  EXPECT_NO_THROW(validate(apart, result.plan));
}

// ---- F5: long schedules and the deadline --------------------------------------------------

TEST(PlannerLimits, F5_GreedyOnManyAllocFreePairsReusesOneSlot) {
  // Each pair is freed before the next: greedy puts them all at offset 0. (The timed
  // comparison with 10^6 pairs is bench/planner_bench.cpp.)
  const std::vector<Buffer> buffers = alloc_free_pairs(100000);
  const Plan greedy = plan_greedy(buffers, GreedyOrder::kSize);
  EXPECT_EQ(greedy.arena_size, 448u);
  for (const std::uint64_t offset : greedy.offsets) ASSERT_EQ(offset, 0u);
  EXPECT_NO_THROW(validate(buffers, greedy));
}

TEST(PlannerLimits, F5_ZeroTimeLimitCutsGreedyShortWithAValidPlan) {
  // Past the first batch of placements, greedy by size looks at the clock: with no time it
  // stops there and stacks the rest, rather than finishing before looking.
  const std::vector<Buffer> buffers = alloc_free_pairs(5000);
  const PlanResult result = plan(buffers, PlannerOptions{.time_limit_seconds = 0.0});
  EXPECT_TRUE(result.cut_short);
  EXPECT_TRUE(result.timed_out);
  EXPECT_GT(result.plan.arena_size, lower_bound(buffers));
  EXPECT_NO_THROW(validate(buffers, result.plan));
  // A problem within the first batch still gets its whole greedy plan.
  const std::vector<Buffer> small = alloc_free_pairs(500);
  const PlanResult whole = plan(small, PlannerOptions{.time_limit_seconds = 0.0});
  EXPECT_FALSE(whole.cut_short);
  EXPECT_EQ(whole.plan.arena_size, 448u);
}

TEST(PlannerLimits, F5_PlanReturnsSoonAfterItsTimeLimit) {
  const std::vector<Buffer> buffers = tangled_buffers(400);
  const auto start = std::chrono::steady_clock::now();
  const PlanResult result = plan(buffers, PlannerOptions{.time_limit_seconds = 0.2});
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 0.2 + 5.0);  // generous: sanitizer builds and loaded machines
  EXPECT_NO_THROW(validate(buffers, result.plan));
  EXPECT_FALSE(result.cut_short);
}

// ---- F6: absurd time limits -----------------------------------------------------------------

TEST(PlannerLimits, F6_HugeTimeLimitIsClampedNotUndefined) {
  // 1e300 s overflowed the conversion to the clock's ticks (undefined behaviour), and the
  // deadline it gave had passed: only greedy ran. Clamped, the search runs to its end.
  // Every greedy order needs 10 bytes here; the search finds the 9 of the lower bound.
  const std::vector<Buffer> buffers = {
      {.id = 0, .lower = 4, .upper = 8, .size = 1}, {.id = 1, .lower = 6, .upper = 8, .size = 4},
      {.id = 2, .lower = 0, .upper = 3, .size = 4}, {.id = 3, .lower = 0, .upper = 2, .size = 4},
      {.id = 4, .lower = 1, .upper = 5, .size = 1}, {.id = 5, .lower = 3, .upper = 8, .size = 4}};
  ASSERT_EQ(plan_greedy(buffers, GreedyOrder::kSize).arena_size, 10u);
  ASSERT_EQ(lower_bound(buffers), 9u);
  for (const double limit :
       {1e300, std::numeric_limits<double>::infinity(), kMaxTimeLimitSeconds}) {
    const PlanResult result = plan(buffers, PlannerOptions{.time_limit_seconds = limit});
    EXPECT_FALSE(result.timed_out) << limit;
    EXPECT_TRUE(result.optimal) << limit;
    EXPECT_EQ(result.plan.arena_size, result.lower_bound) << limit;
  }
  EXPECT_THROW(plan(buffers, PlannerOptions{.time_limit_seconds = -1.0}), InvalidArgument);
  EXPECT_THROW(plan(buffers, PlannerOptions{.time_limit_seconds = std::nan("")}), InvalidArgument);
}

// ---- The node limit: a deterministic budget beside the clock ------------------------------

TEST(PlannerLimits, NodeLimitStopsTheSearchAndGivesTheSamePlanEveryRun) {
  // MiniMalloc's D: its bound is out of the search's reach in 20000 nodes (docs/planner.md).
  const std::vector<Buffer> buffers =
      read_interval_csv(std::string(SDALLOC_DATA_DIR) + "/minimalloc/D.1048576.csv");
  const PlannerOptions options{.time_limit_seconds = 60.0, .max_search_nodes = 20000};
  const PlanResult first = plan(buffers, options);
  const PlanResult second = plan(buffers, options);
  EXPECT_NO_THROW(validate(buffers, first.plan));
  EXPECT_TRUE(first.timed_out);  // the search could not finish in 20000 nodes
  EXPECT_FALSE(first.optimal);
  EXPECT_LE(first.search_nodes, 20000u);
  EXPECT_GT(first.search_nodes, 10000u);  // the probes shared the budget and spent it
  EXPECT_LT(first.seconds, 30.0);         // stopped by the nodes, not the 60 s clock
  EXPECT_EQ(first.plan.offsets, second.plan.offsets);
  EXPECT_EQ(first.plan.arena_size, second.plan.arena_size);
  EXPECT_EQ(first.search_nodes, second.search_nodes);
  // A single node: the greedy plan, valid, and a search that stopped at once.
  const PlanResult one = plan(buffers, PlannerOptions{.max_search_nodes = 1});
  EXPECT_NO_THROW(validate(buffers, one.plan));
  EXPECT_LE(one.search_nodes, 1u);
  EXPECT_LE(first.plan.arena_size, one.plan.arena_size);
}

TEST(PlannerLimits, NodeLimitLeavesAnEasySearchAlone) {
  // F6's instance: the search proves the bound in a few nodes, far inside the limit.
  const std::vector<Buffer> buffers = {
      {.id = 0, .lower = 4, .upper = 8, .size = 1}, {.id = 1, .lower = 6, .upper = 8, .size = 4},
      {.id = 2, .lower = 0, .upper = 3, .size = 4}, {.id = 3, .lower = 0, .upper = 2, .size = 4},
      {.id = 4, .lower = 1, .upper = 5, .size = 1}, {.id = 5, .lower = 3, .upper = 8, .size = 4}};
  const PlanResult result = plan(buffers, PlannerOptions{.max_search_nodes = 100000});
  EXPECT_TRUE(result.optimal);
  EXPECT_FALSE(result.timed_out);
  EXPECT_EQ(result.plan.arena_size, 9u);
}

}  // namespace
}  // namespace sdalloc
