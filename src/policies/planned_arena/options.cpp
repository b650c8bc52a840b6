// policies/planned_arena/options.cpp - PlannedArenaOptions' checks, made once when a
// PlannedArena is built (the fallback pool's through CachingPoolOptions::validate).
#include "sdalloc/core/errors.hpp"
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
  fallback.validate();
}

}  // namespace sdalloc
