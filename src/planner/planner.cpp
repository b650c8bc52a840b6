// plan(): the greedy heuristics first (fast, usually close), then the canonical search's
// probes (probe_schedule.cpp): with a capacity, for a plan within it; without, for the
// smallest arena they can find. The deadline holds from the first step: greedy by size is
// cut short when it passes (the rest stacked, see PlanResult::cut_short). The plan returned
// is the best found, always validated.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "planner/heuristics.hpp"
#include "planner/probe_schedule.hpp"
#include "sdalloc/planner/planner.hpp"

namespace sdalloc {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

PlanResult plan(std::span<const Buffer> buffers, const PlannerOptions& options) {
  check_buffers(buffers);
  if (!(options.time_limit_seconds >= 0.0)) {
    throw InvalidArgument("time limit must be non-negative");
  }
  if (!(options.search_time_limit_seconds >= 0.0)) {
    throw InvalidArgument("search time limit must be non-negative");
  }
  if (!(options.accept_within >= 0.0)) {
    throw InvalidArgument("accept_within must be non-negative");
  }
  const Clock::time_point start = Clock::now();
  // Clamped before the conversion: a double beyond the clock's range (1e300, infinity) is
  // undefined behaviour in duration_cast. kMaxTimeLimitSeconds is no limit in practice.
  const double limit = std::min(options.time_limit_seconds, kMaxTimeLimitSeconds);
  const Clock::time_point deadline =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limit));
  PlanResult result;
  result.lower_bound = lower_bound(buffers);
  const std::uint64_t acceptable = planner_detail::acceptable_arena(result.lower_bound, options);
  const auto good_enough = [&](std::uint64_t arena) {
    return arena <= acceptable || (options.capacity != 0 && arena <= options.capacity);
  };
  const auto consider = [&](Plan candidate, std::string method) {
    if (result.method.empty() || candidate.arena_size < result.plan.arena_size) {
      result.plan = std::move(candidate);
      result.method = std::move(method);
    }
  };

  // Greedy by size always runs, so there is a plan even when the rest is switched off or
  // out of time; when even it runs out of time, that plan is all there is.
  planner_detail::GreedyResult by_size =
      planner_detail::greedy_within(buffers, GreedyOrder::kSize, deadline);
  consider(std::move(by_size.plan), "greedy-size");
  const auto finish = [&](std::uint64_t proven_below) {
    validate(buffers, result.plan);
    result.fits = options.capacity == 0 || result.plan.arena_size <= options.capacity;
    result.optimal = result.plan.arena_size <= proven_below;
    result.seconds = seconds_since(start);
    return std::move(result);
  };
  if (!by_size.complete) {
    result.cut_short = true;
    result.timed_out = true;
    return finish(result.lower_bound);
  }
  if (options.use_heuristics) {
    const std::pair<GreedyOrder, const char*> others[] = {
        {GreedyOrder::kBestFit, "greedy-best-fit"},
        {GreedyOrder::kArea, "greedy-area"},
        {GreedyOrder::kLifetime, "greedy-lifetime"}};
    for (const auto& [order, name] : others) {
      if (good_enough(result.plan.arena_size) || Clock::now() >= deadline) break;
      planner_detail::GreedyResult other = planner_detail::greedy_within(buffers, order, deadline);
      if (!other.complete) {
        result.timed_out = true;
        break;
      }
      consider(std::move(other.plan), name);
    }
  }

  std::uint64_t proven_below = result.lower_bound;  // no plan smaller than this exists
  if (options.use_search && !good_enough(result.plan.arena_size)) {
    // The search's own limit counts from here: the greedy plans above are never cut by it.
    const double search_limit = std::min(options.search_time_limit_seconds, kMaxTimeLimitSeconds);
    const Clock::time_point search_deadline =
        std::min(deadline, Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double>(search_limit)));
    planner_detail::run_probes(buffers, options, start, search_deadline, result, proven_below);
  }

  return finish(proven_below);
}

}  // namespace sdalloc
