// planner_budget_test.cpp - what bounds the planner's work when it plans at run time
// (PlannedArena): a plan good enough (accept_within) ends the search, the search's own time
// limit leaves the greedy plans whole, and the linear-time paths taken for a recorded step's
// dense times and ids give the answers of the general ones.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/planner/planner.hpp"

namespace sdalloc {
namespace {

std::vector<Buffer> instance(const std::string& name) {
  return read_interval_csv(std::string(SDALLOC_DATA_DIR) + "/minimalloc/" + name + ".1048576.csv");
}

// D: its best greedy plan is about 1.3 x its bound, which no short search reaches.
TEST(PlannerBudget, APlanWithinAcceptWithinOfTheBoundEndsTheSearchAtOnce) {
  const std::vector<Buffer> buffers = instance("D");
  const PlanResult greedy = plan(buffers, PlannerOptions{.use_search = false});
  const double above =
      static_cast<double>(greedy.plan.arena_size) / static_cast<double>(greedy.lower_bound) - 1.0;
  ASSERT_GT(above, 0.1);
  // The node limit, not the clock, must end these searches: a time limit far above what
  // 20,000 nodes take even in a sanitizer build on a loaded machine.
  PlannerOptions options{.time_limit_seconds = 600.0, .max_search_nodes = 20000};
  options.accept_within = above + 0.01;  // the greedy plan is good enough
  const PlanResult accepted = plan(buffers, options);
  EXPECT_EQ(accepted.search_nodes, 0u);
  EXPECT_EQ(accepted.plan.arena_size, greedy.plan.arena_size);
  EXPECT_FALSE(accepted.timed_out);
  options.accept_within = above / 2;  // the search must beat it, and stops once it has
  const PlanResult searched = plan(buffers, options);
  EXPECT_GT(searched.search_nodes, 0u);
  EXPECT_LE(static_cast<double>(searched.plan.arena_size),
            (1.0 + above / 2) * static_cast<double>(searched.lower_bound));
  EXPECT_LT(searched.search_nodes, options.max_search_nodes) << "it did not stop when it could";
  options.accept_within = 0.0;  // only the bound: the search runs to its limit
  EXPECT_EQ(plan(buffers, options).search_nodes, options.max_search_nodes);
}

TEST(PlannerBudget, TheSearchTimeLimitLeavesTheGreedyPlansWhole) {
  const std::vector<Buffer> buffers = instance("J");
  PlannerOptions options{.time_limit_seconds = 30.0};
  options.search_time_limit_seconds = 0.0;
  const auto start = std::chrono::steady_clock::now();
  const PlanResult result = plan(buffers, options);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 2.0);
  EXPECT_FALSE(result.cut_short);
  const PlanResult greedy = plan(buffers, PlannerOptions{.use_search = false});
  EXPECT_EQ(result.plan.arena_size, greedy.plan.arena_size);
  EXPECT_NO_THROW(validate(buffers, result.plan));
  options.search_time_limit_seconds = 0.3;  // some search, ending well before the limit
  EXPECT_LT(plan(buffers, options).seconds, 2.0);
}

TEST(PlannerBudget, NegativeOrNanLimitsAreRejected) {
  const std::vector<Buffer> buffers = {{.id = 0, .lower = 0, .upper = 1, .size = 8}};
  for (const double bad : {-1.0, std::numeric_limits<double>::quiet_NaN()}) {
    PlannerOptions options;
    options.search_time_limit_seconds = bad;
    EXPECT_THROW(plan(buffers, options), InvalidArgument);
    options = PlannerOptions{};
    options.accept_within = bad;
    EXPECT_THROW(plan(buffers, options), InvalidArgument);
  }
  PlannerOptions huge;
  huge.accept_within = 1e300;  // any plan is good enough; no overflow on the way
  huge.search_time_limit_seconds = 1e300;
  EXPECT_EQ(plan(buffers, huge).plan.arena_size, 8u);
}

// Random buffers over dense times (the sweeps count-sort them) and the same spread far apart
// (they sort them): the bound, the plans and the validator agree.
TEST(PlannerBudget, DenseAndSparseTimesGiveTheSameBoundsPlansAndChecks) {
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<std::int64_t> time(0, 299);
  std::uniform_int_distribution<std::uint64_t> size(1, 64);
  std::vector<Buffer> dense;
  for (std::uint64_t i = 0; i < 200; ++i) {
    std::int64_t a = time(rng);
    std::int64_t b = time(rng);
    if (a > b) std::swap(a, b);
    dense.push_back(Buffer{.id = i, .lower = a, .upper = b + 1, .size = 512 * size(rng)});
  }
  std::vector<Buffer> sparse = dense;
  for (Buffer& b : sparse) {
    b.lower = b.lower * (std::int64_t{1} << 40) - (std::int64_t{1} << 61);
    b.upper = b.upper * (std::int64_t{1} << 40) - (std::int64_t{1} << 61);
  }
  EXPECT_EQ(lower_bound(dense), lower_bound(sparse));
  for (const GreedyOrder order :
       {GreedyOrder::kSize, GreedyOrder::kBestFit, GreedyOrder::kArea, GreedyOrder::kLifetime}) {
    const Plan a = plan_greedy(dense, order);
    EXPECT_EQ(a.offsets, plan_greedy(sparse, order).offsets);
    EXPECT_NO_THROW(validate(sparse, a));
  }
  // A conflict the validator must see in both: buffer 1 moved onto buffer 0 while both live.
  Plan overlapping = plan_greedy(dense, GreedyOrder::kSize);
  std::size_t j = 1;
  while (!(dense[j].lower < dense[0].upper && dense[0].lower < dense[j].upper)) ++j;
  overlapping.offsets[j] = overlapping.offsets[0];
  overlapping.arena_size = 0;
  for (std::size_t i = 0; i < dense.size(); ++i) {
    overlapping.arena_size =
        std::max(overlapping.arena_size, overlapping.offsets[i] + dense[i].size);
  }
  EXPECT_THROW(validate(dense, overlapping), InvalidArgument);
  EXPECT_THROW(validate(sparse, overlapping), InvalidArgument);
}

TEST(PlannerBudget, DuplicateIdsAreFoundSmallOrLarge) {
  const auto buffer = [](std::uint64_t id) {
    return Buffer{.id = id, .lower = 0, .upper = 1, .size = 8};
  };
  EXPECT_THROW(check_buffers(std::vector<Buffer>{buffer(1), buffer(0), buffer(1)}),
               InvalidArgument);
  const std::uint64_t large = std::uint64_t{1} << 50;
  EXPECT_THROW(check_buffers(std::vector<Buffer>{buffer(large), buffer(0), buffer(large)}),
               InvalidArgument);
  EXPECT_NO_THROW(check_buffers(std::vector<Buffer>{buffer(large), buffer(0), buffer(1)}));
}

}  // namespace
}  // namespace sdalloc
