// planner/probe_schedule.hpp - which capacities plan() asks the search about, in what order,
// with what share of the time, and on how many threads. Internal to the library; the
// schedule is described in probe_schedule.cpp and docs/planner.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>

#include "sdalloc/planner/planner.hpp"  // Buffer, PlannerOptions, PlanResult

namespace sdalloc::planner_detail {

// The largest arena good enough to end the search: the lower bound, raised by
// options.accept_within of it (saturating).
std::uint64_t acceptable_arena(std::uint64_t lower_bound, const PlannerOptions& options);

// Improves result.plan (the best greedy plan on entry) with search probes until `deadline`
// or options' node limit: with options.capacity, one probe for a plan within it; without,
// the lower bound, a bisection and sweeps below the best plan. Raises `proven_below` (no
// plan is smaller) as probes prove targets infeasible, and sets result.method, timed_out and
// search_nodes. With more than one thread (PlannerOptions::threads) the sweeps run beside
// the bisection. Without a capacity it stops once the best plan is acceptable_arena() or
// less. An exception from a probe (std::bad_alloc) propagates once every thread
// has stopped.
void run_probes(std::span<const Buffer> buffers, const PlannerOptions& options,
                std::chrono::steady_clock::time_point start,
                std::chrono::steady_clock::time_point deadline, PlanResult& result,
                std::uint64_t& proven_below);

}  // namespace sdalloc::planner_detail
