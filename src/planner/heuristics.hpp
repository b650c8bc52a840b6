// planner/heuristics.hpp - the greedy placements behind plan_greedy() and plan(), with a
// deadline. Internal to the library; see heuristics.cpp for the method.
#pragma once

#include <chrono>
#include <span>

#include "sdalloc/planner/planner.hpp"  // Buffer, Plan, GreedyOrder

namespace sdalloc::planner_detail {

struct GreedyResult {
  Plan plan;
  // False when the deadline passed first: the buffers not yet placed then are stacked above
  // the rest, one over another (a valid plan, but far from a good one).
  bool complete = true;
};

// plan_greedy(buffers, order), looking at the clock every 1024 buffers placed. `buffers` must have
// passed check_buffers(). Throws InvalidArgument when a placement would not fit below 2^64.
GreedyResult greedy_within(std::span<const Buffer> buffers, GreedyOrder order,
                           std::chrono::steady_clock::time_point deadline);

}  // namespace sdalloc::planner_detail
