// plan(): the greedy heuristics first (fast, usually close), then the canonical search for
// a plan within the capacity or, without a capacity, for a smaller arena, bisecting between
// the lower bound and the best plan so far until the time budget runs out. The deadline
// holds from the first step: greedy by size is cut short when it passes (the rest stacked,
// see PlanResult::cut_short). The plan returned is always validated.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>

#include "planner/heuristics.hpp"
#include "planner/search.hpp"
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
  const Clock::time_point start = Clock::now();
  // Clamped before the conversion: a double beyond the clock's range (1e300, infinity) is
  // undefined behaviour in duration_cast. kMaxTimeLimitSeconds is no limit in practice.
  const double limit = std::min(options.time_limit_seconds, kMaxTimeLimitSeconds);
  const Clock::time_point deadline =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limit));
  PlanResult result;
  result.lower_bound = lower_bound(buffers);
  const auto good_enough = [&](std::uint64_t arena) {
    return arena == result.lower_bound || (options.capacity != 0 && arena <= options.capacity);
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
    Clock::time_point last_progress = start;
    std::uint64_t nodes = 0;  // of the searches finished
    const auto tick = [&](std::uint64_t searching) {
      const Clock::time_point now = Clock::now();
      if (options.progress && now - last_progress >= std::chrono::seconds(1)) {
        last_progress = now;
        options.progress(PlanProgress{.seconds = seconds_since(start),
                                      .best_arena = result.plan.arena_size,
                                      .lower_bound = result.lower_bound,
                                      .nodes = nodes + searching});
      }
    };
    if (options.capacity != 0) {
      const auto found = planner_detail::search_within(buffers, options.capacity, deadline, tick);
      nodes += found.nodes;
      if (found.outcome == planner_detail::SearchOutcome::kFound) consider(found.plan, "search");
      if (found.outcome == planner_detail::SearchOutcome::kTimedOut) result.timed_out = true;
    } else {
      // Bisect between the lowest arena not yet ruled out and the best plan. A probe gets a
      // quarter of the time left, so one hard probe cannot eat the whole budget; one that
      // runs out of time only moves the bisection up (nothing is proven), one that exhausts
      // its space proves the bound.
      std::uint64_t low = proven_below;
      while (low < result.plan.arena_size && Clock::now() < deadline) {
        const std::uint64_t target = low + (result.plan.arena_size - 1 - low) / 2;
        const Clock::time_point now = Clock::now();
        const Clock::time_point probe_deadline =
            std::min(deadline, now + (deadline - now) / 4 + std::chrono::milliseconds(50));
        const auto found = planner_detail::search_within(buffers, target, probe_deadline, tick);
        nodes += found.nodes;
        if (found.outcome == planner_detail::SearchOutcome::kFound) {
          consider(found.plan, "search");
        } else if (found.outcome == planner_detail::SearchOutcome::kInfeasible) {
          low = target + 1;
          proven_below = std::max(proven_below, target + 1);  // no plan fits in target
        } else {
          low = target + 1;
          result.timed_out = true;
        }
      }
    }
    result.search_nodes = nodes;
  }

  return finish(proven_below);
}

}  // namespace sdalloc
