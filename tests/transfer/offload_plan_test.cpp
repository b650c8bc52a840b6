// offload_plan_test.cpp - the planner: the budget holds at every load, every use finds its
// weights, eviction is Belady's (never more loads than LRU), and the budget error.
#include "sdalloc/transfer/offload_plan.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "sdalloc/core/errors.hpp"
#include "support/test_support.hpp"

namespace sdalloc {
namespace {

// Replays a plan step after step; checks the invariants and answers the loads per step.
std::size_t replay(const OffloadPlanInput& input, int steps) {
  std::set<std::size_t> resident(input.resident.begin(), input.resident.end());
  std::size_t bytes = 0;
  for (const std::size_t id : resident) bytes += input.sizes[id];
  std::size_t last_loads = 0;
  for (int step = 0; step < steps; ++step) {
    OffloadPlanInput in = input;
    in.resident.assign(resident.begin(), resident.end());
    const OffloadPlan plan = plan_offload(in);
    last_loads = plan.loads;
    for (std::size_t i = 0; i < in.uses.size(); ++i) {
      for (const std::size_t v : plan.evict_before[i]) {
        EXPECT_EQ(resident.erase(v), 1u);
        bytes -= in.sizes[v];
        EXPECT_EQ(std::count(in.uses[i].begin(), in.uses[i].end(), v), 0);
      }
      for (const std::size_t w : plan.load_before[i]) {
        EXPECT_TRUE(resident.insert(w).second);
        bytes += in.sizes[w];
        EXPECT_LE(bytes, in.budget) << "step " << step << " use " << i;
      }
      for (const std::size_t w : in.uses[i]) EXPECT_EQ(resident.count(w), 1u) << "use " << i;
    }
    EXPECT_EQ(std::vector<std::size_t>(resident.begin(), resident.end()), plan.resident_at_end);
  }
  return last_loads;
}

// Loads per step of least-recently-used eviction, loading at the use (the baseline).
std::size_t lru_loads(const OffloadPlanInput& in, int steps) {
  std::vector<std::size_t> order;  // front: least recent
  std::size_t bytes = 0, loads = 0;
  for (int step = 0; step < steps; ++step) {
    loads = 0;
    for (const auto& use : in.uses) {
      for (const std::size_t w : use) {
        const auto it = std::find(order.begin(), order.end(), w);
        if (it != order.end()) {
          order.erase(it);
        } else {
          while (bytes + in.sizes[w] > in.budget) {
            const auto victim = std::find_if(order.begin(), order.end(), [&](std::size_t v) {
              return std::find(use.begin(), use.end(), v) == use.end();
            });
            bytes -= in.sizes[*victim];
            order.erase(victim);
          }
          bytes += in.sizes[w];
          ++loads;
        }
        order.push_back(w);
      }
    }
  }
  return loads;
}

OffloadPlanInput random_model(std::mt19937& rng, std::size_t layers) {
  OffloadPlanInput in;
  std::uniform_int_distribution<std::size_t> size(1, 100);
  for (std::size_t i = 0; i < layers; ++i) {
    in.sizes.push_back(size(rng) * 1000);
    in.uses.push_back({i});
  }
  // A weight used twice (tied embeddings) and a layer reading two weights.
  in.uses.push_back({0});
  in.uses.push_back({1, layers - 1});
  return in;
}

TEST(OffloadPlan, BudgetHoldsAtEveryLoadAndEveryUseFindsItsWeights) {
  std::mt19937 rng(14);
  for (int trial = 0; trial < 200; ++trial) {
    OffloadPlanInput in = random_model(rng, 3 + static_cast<std::size_t>(trial % 20));
    std::size_t total = 0;
    std::size_t largest_use = 0;
    for (const auto& use : in.uses) {
      std::size_t b = 0;
      for (const std::size_t w : use) b += in.sizes[w];
      largest_use = std::max(largest_use, b);
    }
    for (const std::size_t s : in.sizes) total += s;
    in.budget = largest_use + (total - largest_use) * static_cast<std::size_t>(trial % 5) / 4;
    in.prefetch = static_cast<std::size_t>(trial % 4);
    (void)replay(in, 3);
  }
}

TEST(OffloadPlan, BeladyNeverLoadsMoreThanLruOnEqualSizes) {
  // Farthest-next-use is optimal for equal sizes; on a cyclic order LRU misses every time.
  std::mt19937 rng(5);
  for (int trial = 0; trial < 100; ++trial) {
    OffloadPlanInput in = random_model(rng, 4 + static_cast<std::size_t>(trial % 12));
    std::fill(in.sizes.begin(), in.sizes.end(), 1000);
    in.budget = 2000 + 1000 * static_cast<std::size_t>(trial % 3);
    in.prefetch = 0;
    EXPECT_LE(replay(in, 3), lru_loads(in, 3)) << "trial " << trial;
  }
  OffloadPlanInput cyclic;
  cyclic.sizes.assign(8, 1000);
  for (std::size_t i = 0; i < 8; ++i) cyclic.uses.push_back({i});
  cyclic.budget = 4000;
  cyclic.prefetch = 0;
  EXPECT_EQ(lru_loads(cyclic, 3), 8u);
  EXPECT_LT(replay(cyclic, 3), 8u);
}

TEST(OffloadPlan, EverythingFitsMeansNoLoadsAfterTheFirstStep) {
  OffloadPlanInput in;
  in.sizes = {10, 20, 30};
  in.uses = {{0}, {1}, {2}};
  in.budget = 60;
  EXPECT_EQ(plan_offload(in).loads, 3u);
  EXPECT_EQ(replay(in, 2), 0u);
}

TEST(OffloadPlan, PrefetchIssuesLoadsAheadAndIntoTheNextStep) {
  OffloadPlanInput in;
  in.sizes = {10, 10, 10, 10, 10, 10};
  in.uses = {{0}, {1}, {2}, {3}, {4}, {5}};
  in.budget = 30;
  in.prefetch = 2;
  const OffloadPlan plan = plan_offload(in);
  EXPECT_EQ(plan.load_before[0], (std::vector<std::size_t>{0, 1, 2}));
  EXPECT_EQ(plan.load_before[1], (std::vector<std::size_t>{3}));
  // The last uses fetch the next step's first weights.
  EXPECT_EQ(plan.resident_at_end, (std::vector<std::size_t>{0, 1, 5}));
  EXPECT_LE(plan.peak_resident_bytes, in.budget);
}

TEST(OffloadPlan, BudgetBelowTheLargestUseIsAnErrorThatSaysSo) {
  OffloadPlanInput in;
  in.sizes = {100, 300};
  in.uses = {{0}, {1}};
  in.budget = 200;
  try {
    (void)plan_offload(in);
    FAIL() << "a budget below the largest weight was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(test::Contains(e.what(), "is below the 300 B"));
    EXPECT_TRUE(test::Contains(e.what(), "use 1"));
  }
  in.uses = {{0}, {5}};
  in.budget = 1000;
  EXPECT_THROW((void)plan_offload(in), InvalidArgument);
}

}  // namespace
}  // namespace sdalloc
