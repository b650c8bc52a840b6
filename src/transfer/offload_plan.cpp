// offload_plan.cpp - in-order loads within a prefetch window, Belady eviction for room.
#include "sdalloc/transfer/offload_plan.hpp"

#include <algorithm>
#include <limits>
#include <string>

#include "sdalloc/core/errors.hpp"

namespace sdalloc {

namespace {

std::size_t use_bytes(const OffloadPlanInput& in, const std::vector<std::size_t>& use) {
  std::vector<std::size_t> ids(use);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  std::size_t bytes = 0;
  for (const std::size_t id : ids) bytes += in.sizes[id];
  return bytes;
}

}  // namespace

OffloadPlan plan_offload(const OffloadPlanInput& in) {
  const std::size_t n = in.uses.size();
  const std::size_t weights = in.sizes.size();
  for (std::size_t i = 0; i < n; ++i) {
    for (const std::size_t id : in.uses[i]) {
      if (id >= weights) {
        throw InvalidArgument("plan_offload: use " + std::to_string(i) + " names weight " +
                              std::to_string(id) + " of " + std::to_string(weights));
      }
    }
    if (const std::size_t bytes = use_bytes(in, in.uses[i]); bytes > in.budget) {
      throw InvalidArgument("offload: the budget " + format_bytes(in.budget) + " is below the " +
                            format_bytes(bytes) + " that use " + std::to_string(i) +
                            " needs at once (its largest weight alone: " +
                            "the budget must hold every weight of one layer)");
    }
  }
  OffloadPlan plan;
  plan.evict_before.resize(n);
  plan.load_before.resize(n);
  std::vector<char> resident(weights, 0);
  std::size_t resident_bytes = 0;
  for (const std::size_t id : in.resident) {
    if (id >= weights) throw InvalidArgument("plan_offload: a resident weight is out of range");
    if (resident[id] == 0) resident_bytes += in.sizes[id];
    resident[id] = 1;
  }
  if (resident_bytes > in.budget) {
    throw InvalidArgument("plan_offload: the weights resident at the start exceed the budget");
  }
  plan.resident_at_start = in.resident;
  std::sort(plan.resident_at_start.begin(), plan.resident_at_start.end());
  plan.peak_resident_bytes = resident_bytes;
  if (n == 0) {
    plan.resident_at_end = plan.resident_at_start;
    return plan;
  }
  // Positions past n are the next step's uses (the same order): position p uses uses[p % n].
  const auto use_at = [&](std::size_t p) -> const std::vector<std::size_t>& {
    return in.uses[p % n];
  };
  const std::size_t horizon = n + std::min(in.prefetch, n);  // loads issued up to here
  // Next position >= from (cyclic, up to two steps ahead) that uses id.
  const auto next_use = [&](std::size_t id, std::size_t from) {
    for (std::size_t p = from; p < from + 2 * n; ++p) {
      const auto& use = use_at(p);
      if (std::find(use.begin(), use.end(), id) != use.end()) return p;
    }
    return std::numeric_limits<std::size_t>::max();
  };
  std::size_t next_load = 0;  // the first position whose weights may still need a load
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t window_end = std::min(i + in.prefetch, horizon - 1);
    while (next_load <= window_end) {
      const std::size_t p = std::max(next_load, i);
      bool complete = true;
      for (const std::size_t w : use_at(p)) {
        if (resident[w] != 0) continue;
        // Room: evict the farthest-next-use weight among those uses i..p do not need.
        while (resident_bytes + in.sizes[w] > in.budget) {
          std::size_t victim = weights;
          std::size_t farthest = 0;
          for (std::size_t v = 0; v < weights; ++v) {
            if (resident[v] == 0) continue;
            const std::size_t next = next_use(v, i);
            if (next <= p) continue;  // needed by a use up to p: protected
            if (victim == weights || next > farthest) {
              victim = v;
              farthest = next;
            }
          }
          if (victim == weights) break;
          resident[victim] = 0;
          resident_bytes -= in.sizes[victim];
          plan.evict_before[i].push_back(victim);
        }
        if (resident_bytes + in.sizes[w] > in.budget) {
          complete = false;  // no room yet: retried before a later use
          break;
        }
        resident[w] = 1;
        resident_bytes += in.sizes[w];
        plan.load_before[i].push_back(w);
        plan.loaded_bytes += in.sizes[w];
        ++plan.loads;
        plan.peak_resident_bytes = std::max(plan.peak_resident_bytes, resident_bytes);
      }
      if (!complete) break;
      next_load = p + 1;
    }
  }
  for (std::size_t id = 0; id < weights; ++id) {
    if (resident[id] != 0) plan.resident_at_end.push_back(id);
  }
  return plan;
}

}  // namespace sdalloc
