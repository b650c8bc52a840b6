// policies/planned_arena/options.cpp - PlannedArenaOptions' checks, made once when a
// PlannedArena is built (the fallback pool's through CachingPoolOptions::validate), and the
// planner's options they give a recording.
#include "policies/planned_arena/step_recorder.hpp"
#include "sdalloc/core/errors.hpp"
#include "sdalloc/planner/planner.hpp"
#include "sdalloc/policies/planned_arena.hpp"

namespace sdalloc {

void PlannedArenaOptions::validate() const {
  if (replan_after_divergent_steps == 0) {
    throw InvalidArgument("PlannedArenaOptions: replan_after_divergent_steps must be >= 1");
  }
  if (max_plans == 0) throw InvalidArgument("PlannedArenaOptions: max_plans must be >= 1");
  if (!(planner_time_limit_seconds >= 0.0)) {
    throw InvalidArgument("PlannedArenaOptions: planner_time_limit_seconds must be >= 0");
  }
  if (!(planner_share_of_step >= 0.0)) {
    throw InvalidArgument("PlannedArenaOptions: planner_share_of_step must be >= 0");
  }
  if (!(plan_within >= 0.0)) {
    throw InvalidArgument("PlannedArenaOptions: plan_within must be >= 0");
  }
  fallback.validate();
}

namespace planned_arena_detail {

PlannerOptions planner_options_of(const PlannedArenaOptions& options, double seconds_recorded) {
  PlannerOptions p;
  p.time_limit_seconds = options.planner_time_limit_seconds;
  p.max_search_nodes = options.planner_max_search_nodes;
  p.accept_within = options.plan_within;
  if (options.planner_max_search_nodes == 0) {
    p.search_time_limit_seconds = options.planner_share_of_step * seconds_recorded;
  }
  return p;
}

}  // namespace planned_arena_detail
}  // namespace sdalloc
