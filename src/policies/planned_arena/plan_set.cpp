// policies/planned_arena/plan_set.cpp - matching a step to a plan, and dropping plans that
// steps keep diverging from.
#include "policies/planned_arena/plan_set.hpp"

#include <algorithm>

namespace sdalloc::planned_arena_detail {
namespace {

bool less_recently_used(const std::shared_ptr<StepPlan>& a, const std::shared_ptr<StepPlan>& b) {
  return a->last_used < b->last_used;
}

}  // namespace

std::shared_ptr<StepPlan> PlanSet::match_first_allocation(std::size_t rounded,
                                                          std::size_t alignment) {
  std::shared_ptr<StepPlan> best;
  for (const auto& plan : plans_) {
    const Slot& first = plan->slots[plan->events.front().slot];
    if (first.rounded == rounded && first.alignment == alignment &&
        (best == nullptr || plan->last_used > best->last_used)) {
      best = plan;
    }
  }
  if (best != nullptr) best->last_used = ++use_clock_;
  return best;
}

void PlanSet::add(std::shared_ptr<StepPlan> plan) {
  plan->last_used = ++use_clock_;
  plans_.push_back(std::move(plan));
}

bool PlanSet::end_step(const std::shared_ptr<StepPlan>& followed, bool divergent) {
  if (!divergent) {
    if (followed != nullptr) followed->divergent_in_a_row = 0;
    unmatched_in_a_row_ = 0;
    return false;
  }
  // Too many divergent steps in a row: the plan that keeps failing goes (for steps that
  // matched no plan, the least recently followed one), and a later step records anew.
  if (followed != nullptr) {
    if (++followed->divergent_in_a_row < replan_after_) return false;
    drop(followed);
  } else {
    if (++unmatched_in_a_row_ < replan_after_) return false;
    unmatched_in_a_row_ = 0;
    drop(*std::min_element(plans_.begin(), plans_.end(), less_recently_used));
  }
  return true;
}

std::size_t PlanSet::latest_events() const {
  const auto latest = std::max_element(plans_.begin(), plans_.end(), less_recently_used);
  return latest == plans_.end() ? 0 : (*latest)->events.size();
}

void PlanSet::drop(const std::shared_ptr<StepPlan>& plan) {
  plans_.erase(std::find(plans_.begin(), plans_.end(), plan));
}

}  // namespace sdalloc::planned_arena_detail
