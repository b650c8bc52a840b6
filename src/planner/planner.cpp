// plan(): the greedy heuristics first (fast, usually close), then the canonical search: with
// a capacity, for a plan within it; without, for the smallest arena it can find - a probe at
// the lower bound first (a share of the time), then a bisection between the lowest arena not
// ruled out and the best plan so far, each probe with a share of the time left, until the
// time runs out or the two meet. The deadline holds from the first step: greedy by size is
// cut short when it passes (the rest stacked, see PlanResult::cut_short). The plan returned
// is the best found, always validated.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "planner/heuristics.hpp"
#include "planner/search.hpp"
#include "sdalloc/planner/planner.hpp"

namespace sdalloc {
namespace {

using Clock = std::chrono::steady_clock;

// Without a capacity: the probe at the lower bound may take this share of the time left,
// and each bisection probe after it this share of what is left then.
constexpr double kBoundProbeShare = 0.3;
constexpr double kBisectProbeShare = 0.1;
// Then sweeps below the best plan: targets per sweep, and the first budget of each. (Probes
// of 0.3 s at each 1 KiB from 1040 KiB down to 990 KiB find a plan on 10 of the 51 targets
// on MiniMalloc's D, 24 on J, scattered: many short probes beat a few long ones.)
constexpr std::uint64_t kSweepDepth = 12;
constexpr std::chrono::milliseconds kFirstSweepProbe{30};
constexpr std::chrono::milliseconds kMinimumProbe{50};
// Under a node limit (PlannerOptions::max_search_nodes) the probes share the nodes left as
// they share the time, and each may take at least this many.
constexpr std::uint64_t kMinimumProbeNodes = 1024;

// The greatest common divisor of the sizes and of the alignments above 1: offsets built
// from sums of sizes, each rounded up to an alignment, stay multiples of it.
std::uint64_t arena_step(std::span<const Buffer> buffers) {
  std::uint64_t step = 0;
  for (const Buffer& b : buffers) {
    step = std::gcd(step, b.size);
    if (b.alignment > 1) step = std::gcd(step, b.alignment);
  }
  return std::max<std::uint64_t>(step, 1);
}

// value rounded up to a multiple of step, saturating (an arena that large is no target).
std::uint64_t next_multiple(std::uint64_t value, std::uint64_t step) {
  const std::uint64_t rest = value % step;
  if (rest == 0) return value;
  const std::uint64_t gap = step - rest;
  return value > std::numeric_limits<std::uint64_t>::max() - gap
             ? std::numeric_limits<std::uint64_t>::max()
             : value + gap;
}

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
    std::uint64_t nodes = 0;    // of the probes finished
    std::uint64_t probing = 0;  // the capacity the running probe looks for a plan within
    const auto tick = [&](std::uint64_t searching) {
      const Clock::time_point now = Clock::now();
      if (options.progress && now - last_progress >= std::chrono::seconds(1)) {
        last_progress = now;
        options.progress(PlanProgress{.seconds = seconds_since(start),
                                      .best_arena = result.plan.arena_size,
                                      .lower_bound = result.lower_bound,
                                      .nodes = nodes + searching,
                                      .probing = probing});
      }
    };
    // The clock and the node limit: the search goes on while both allow.
    const std::uint64_t max_nodes = options.max_search_nodes;
    const auto out_of_work = [&] {
      return Clock::now() >= deadline || (max_nodes != 0 && nodes >= max_nodes);
    };
    // A share of the nodes left, as a probe's node limit (0: no limit).
    const auto share_of_nodes_left = [&](double share) -> std::uint64_t {
      if (max_nodes == 0) return 0;
      const std::uint64_t left = max_nodes - std::min(nodes, max_nodes);
      const auto part = static_cast<std::uint64_t>(static_cast<double>(left) * share);
      return std::max<std::uint64_t>(1, std::min(left, part + kMinimumProbeNodes));
    };
    // One search for a plan within `target` until `until` or `node_limit` nodes (0: none);
    // true when it found one.
    const auto probe = [&](std::uint64_t target, Clock::time_point until,
                           std::uint64_t node_limit) {
      probing = target;
      const auto found = planner_detail::search_within(
          buffers, target, planner_detail::SearchLimits{until, node_limit}, tick);
      nodes += found.nodes;
      switch (found.outcome) {
        case planner_detail::SearchOutcome::kFound:
          consider(found.plan, "search");
          return true;
        case planner_detail::SearchOutcome::kInfeasible:
          proven_below = std::max(proven_below, target + 1);  // no plan fits in target
          return false;
        case planner_detail::SearchOutcome::kTimedOut:
          result.timed_out = true;
          return false;
      }
      return false;
    };
    // A share of the time left, and at least a little (a probe that is out of time on its
    // first look at the clock has learnt nothing).
    const auto share_of_time_left = [&](double share) {
      const Clock::time_point now = Clock::now();
      const auto slice =
          std::chrono::duration_cast<Clock::duration>((deadline - now) * share) + kMinimumProbe;
      return std::min(deadline, now + slice);
    };
    if (options.capacity != 0) {
      probe(options.capacity, deadline, share_of_nodes_left(1.0));
    } else if (!probe(result.lower_bound, share_of_time_left(kBoundProbeShare),
                      share_of_nodes_left(kBoundProbeShare))) {
      // The bound first: the search is at its most pruned there, and the bound is often
      // reachable (on 9 of MiniMalloc's 11 challenging instances). Then bisect between the lowest
      // arena not ruled out and the best plan. Every plan the search builds has its offsets and
      // arena in multiples of `step`, so the targets are too. A probe that runs out of time proves
      // nothing but moves the bisection up; one that exhausts its space proves that bound; one that
      // finds a plan brings the best down to that plan's arena (often below the target).
      const std::uint64_t step = arena_step(buffers);
      std::uint64_t low = next_multiple(proven_below, step);
      while (low < result.plan.arena_size && !out_of_work()) {
        const std::uint64_t steps = (result.plan.arena_size - low) / step;
        if (steps == 0) break;  // no multiple of step between low and the best
        const std::uint64_t target = low + (steps - 1) / 2 * step;
        if (!probe(target, share_of_time_left(kBisectProbeShare),
                   share_of_nodes_left(kBisectProbeShare))) {
          low = target + step;
        }
      }
      // The bisection met the best plan through probes that only ran out of time. The
      // search's time to a plan jumps with the capacity (on MiniMalloc's J, 1 s within
      // 1029120 bytes, none in 3 s within 1031168 to 1034240), so what is left goes to
      // sweeps of the kSweepDepth targets just below the best, each with a short budget
      // that doubles after a sweep that finds nothing; a plan found restarts the sweep
      // below it. The search is deterministic: a target is not tried again with a budget
      // it already failed in.
      std::vector<std::pair<std::uint64_t, Clock::duration>> failed;
      Clock::duration budget = kFirstSweepProbe;
      // (The best plan is never below proven_below; steps below it are counted so that no
      // sum or product can pass 2^64 - 1, whatever the sizes.)
      while (!out_of_work() && result.plan.arena_size - proven_below >= step) {
        bool improved = false;
        const std::uint64_t room = (result.plan.arena_size - proven_below) / step;
        for (std::uint64_t k = 1; k <= std::min(kSweepDepth, room) && !out_of_work(); ++k) {
          const std::uint64_t target = result.plan.arena_size - k * step;
          if (target < proven_below) break;  // proven out by a probe of this sweep
          const auto tried = std::find_if(failed.begin(), failed.end(),
                                          [&](const auto& entry) { return entry.first == target; });
          if (tried != failed.end() && tried->second >= budget) continue;
          if (probe(target, std::min(deadline, Clock::now() + budget),
                    share_of_nodes_left(kBisectProbeShare))) {
            improved = true;
            break;
          }
          if (tried != failed.end()) {
            tried->second = budget;
          } else {
            failed.emplace_back(target, budget);
          }
        }
        // Capped so that the doubling cannot overflow under a limit of years.
        if (!improved) budget = std::min<Clock::duration>(budget * 2, std::chrono::hours(1));
      }
    }
    result.search_nodes = nodes;
  }

  return finish(proven_below);
}

}  // namespace sdalloc
