// policies/planned_arena/plan_set.hpp - the plans, one per kind of step, and which one a
// step follows.
//
// A step picks its plan by its first plan-stream allocation: the most recently followed
// plan that begins with the same (rounded size, alignment). Kinds of step that begin alike
// share one plan, and the other kind diverges from it. A plan is dropped after
// `replan_after` divergent steps in a row that picked it; divergent steps that picked none
// (the set was full, or the step could not follow any) drop the least recently followed
// plan after as many in a row. A later step is then recorded anew.
//
// Invariants: size() <= max_plans once the caller adds only while !full(); every plan has
// at least one event (StepRecorder makes no plan of an empty step); last_used values are
// distinct and grow with each use. Not thread-safe: PlannedArena's mutex guards it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "policies/planned_arena/step_plan.hpp"

namespace sdalloc::planned_arena_detail {

class PlanSet {
 public:
  PlanSet(std::size_t max_plans, std::size_t replan_after)
      : max_plans_(max_plans), replan_after_(replan_after) {}

  bool empty() const { return plans_.empty(); }
  std::size_t size() const { return plans_.size(); }
  bool full() const { return plans_.size() >= max_plans_; }
  bool within_limit() const { return plans_.size() <= max_plans_; }

  // The most recently followed plan whose first allocation is (rounded, alignment), marked
  // as followed now; nullptr when none begins so.
  std::shared_ptr<StepPlan> match_first_allocation(std::size_t rounded, std::size_t alignment);
  // A new plan, followed now (by the step that recorded it).
  void add(std::shared_ptr<StepPlan> plan);
  void clear() { plans_.clear(); }

  // A step ended that followed `followed` (nullptr: no plan) to its end, or not
  // (`divergent`). True when that dropped a plan (a replan).
  bool end_step(const std::shared_ptr<StepPlan>& followed, bool divergent);

  // Events of the most recently followed plan's recording (0 without a plan).
  std::size_t latest_events() const;

 private:
  void drop(const std::shared_ptr<StepPlan>& plan);

  const std::size_t max_plans_;
  const std::size_t replan_after_;
  std::vector<std::shared_ptr<StepPlan>> plans_;
  std::uint64_t use_clock_ = 0;
  std::size_t unmatched_in_a_row_ = 0;  // divergent steps that followed no plan
};

}  // namespace sdalloc::planned_arena_detail
