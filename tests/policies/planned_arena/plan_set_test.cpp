// plan_set_test.cpp - PlanSet: matching a step to a plan by its first allocation, and
// dropping plans that steps keep diverging from.
#include "policies/planned_arena/plan_set.hpp"

#include <gtest/gtest.h>

#include <memory>

namespace sdalloc::planned_arena_detail {
namespace {

// A plan of one buffer of `rounded` bytes: allocated, then freed.
std::shared_ptr<StepPlan> plan_of(std::size_t rounded, std::size_t alignment = kRounding) {
  auto plan = std::make_shared<StepPlan>();
  Slot slot;
  slot.rounded = rounded;
  slot.alignment = alignment;
  slot.freed_at = 1;
  plan->slots.push_back(slot);
  plan->events = {Event{true, 0}, Event{false, 0}};
  plan->offsets = {0};
  plan->size = rounded;
  return plan;
}

TEST(PlannedArenaPlanSet, MatchesThePlanThatBeginsWithTheSameRequest) {
  PlanSet plans(4, 3);
  const auto small = plan_of(512);
  const auto large = plan_of(4096);
  plans.add(small);
  plans.add(large);
  EXPECT_EQ(plans.match_first_allocation(4096, kRounding), large);
  EXPECT_EQ(plans.match_first_allocation(512, kRounding), small);
  EXPECT_EQ(plans.match_first_allocation(1024, kRounding), nullptr);
  EXPECT_EQ(plans.match_first_allocation(512, 4096), nullptr);  // alignment must match too
}

TEST(PlannedArenaPlanSet, PrefersTheMostRecentlyFollowedOfPlansThatBeginAlike) {
  PlanSet plans(4, 3);
  const auto first = plan_of(512);
  const auto second = plan_of(512);
  plans.add(first);
  plans.add(second);
  EXPECT_EQ(plans.match_first_allocation(512, kRounding), second);
  first->last_used = 100;  // as if a step had followed `first` since
  EXPECT_EQ(plans.match_first_allocation(512, kRounding), first);
}

TEST(PlannedArenaPlanSet, IsFullAtMaxPlans) {
  PlanSet plans(2, 3);
  EXPECT_TRUE(plans.empty());
  plans.add(plan_of(512));
  EXPECT_FALSE(plans.full());
  plans.add(plan_of(1024));
  EXPECT_TRUE(plans.full());
  EXPECT_EQ(plans.size(), 2u);
  plans.clear();
  EXPECT_TRUE(plans.empty());
}

TEST(PlannedArenaPlanSet, DivergentStepsInARowDropTheirPlan) {
  PlanSet plans(4, 2);
  const auto plan = plan_of(512);
  plans.add(plan);
  EXPECT_FALSE(plans.end_step(plan, /*divergent=*/true));
  EXPECT_EQ(plans.size(), 1u);
  EXPECT_TRUE(plans.end_step(plan, /*divergent=*/true));
  EXPECT_TRUE(plans.empty());
}

TEST(PlannedArenaPlanSet, AFollowedStepResetsTheDivergentCount) {
  PlanSet plans(4, 2);
  const auto plan = plan_of(512);
  plans.add(plan);
  EXPECT_FALSE(plans.end_step(plan, true));
  EXPECT_FALSE(plans.end_step(plan, false));
  EXPECT_FALSE(plans.end_step(plan, true));  // one in a row again
  EXPECT_EQ(plans.size(), 1u);
}

TEST(PlannedArenaPlanSet, UnmatchedDivergentStepsDropTheLeastRecentlyFollowedPlan) {
  PlanSet plans(4, 2);
  const auto older = plan_of(512);
  const auto newer = plan_of(1024);
  plans.add(older);
  plans.add(newer);
  EXPECT_FALSE(plans.end_step(nullptr, true));
  EXPECT_TRUE(plans.end_step(nullptr, true));
  ASSERT_EQ(plans.size(), 1u);
  EXPECT_EQ(plans.match_first_allocation(1024, kRounding), newer);
  EXPECT_EQ(plans.match_first_allocation(512, kRounding), nullptr);
}

TEST(PlannedArenaPlanSet, LatestEventsAreThoseOfTheMostRecentlyFollowedPlan) {
  PlanSet plans(4, 3);
  EXPECT_EQ(plans.latest_events(), 0u);
  auto longer = plan_of(512);
  longer->events.push_back(Event{true, 0});  // only the count matters here
  plans.add(longer);
  plans.add(plan_of(1024));
  EXPECT_EQ(plans.latest_events(), 2u);
  plans.match_first_allocation(512, kRounding);
  EXPECT_EQ(plans.latest_events(), 3u);
}

}  // namespace
}  // namespace sdalloc::planned_arena_detail
