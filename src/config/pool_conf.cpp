// pool_conf.cpp - the shared pool rows of SDALLOC_CONF: their names, types and help.
#include "config/pool_conf.hpp"

#include <string>
#include <utility>

namespace sdalloc::config {

const EnumName kModePool{"pool", static_cast<int>(PoolMode::kPool),
                         "a CachingPool over the backend's segments (cudaMalloc, host memory)"};
const EnumName kModeVmm{"vmm", static_cast<int>(PoolMode::kVmm),
                        "a VirtualMemoryPool: physical pages mapped into reserved address "
                        "ranges, like PyTorch's `expandable_segments` (host: memfd); its cap "
                        "is fixed when the pool is created, and it has no segment layout"};
const EnumName kModePlanned{"planned", static_cast<int>(PoolMode::kPlanned),
                            "a repeated step served from one planned arena, over a "
                            "CachingPool (see Planned steps)"};

std::vector<Option<PoolConf>> pool_options(std::vector<EnumName> modes) {
  using C = PoolConf;
  std::vector<Option<PoolConf>> rows = {
      enum_option<C>(
          "mode", "how the pool gets and reuses memory.", std::move(modes),
          [](auto& c) -> auto& { return c.mode; }),
      size_option<C>(
          "capacity", "most bytes one pool may hold; `0`: no cap.",
          [](auto& c) -> auto& { return c.capacity; }),
      count_option<C>(
          "replan_after",
          "`mode:planned`: divergent steps in a row after which the plan is "
          "dropped and the next step recorded again.",
          [](auto& c) -> auto& { return c.replan_after; }),
      count_option<C>(
          "max_plans",
          "`mode:planned`: plans kept at once, one per kind of step (image "
          "size, batch).",
          [](auto& c) -> auto& { return c.max_plans; }),
      count_option<C>(
          "plan_nodes",
          "`mode:planned`: each plan's search stops after this many nodes, as it does at "
          "its time limit (1 s), so every machine makes the same plan (tests, fuzzers); "
          "not set: only the time limit.",
          [](auto& c) -> auto& { return c.plan_nodes; }),
  };
  for (Option<PoolConf>& row : caching_pool_options()) rows.push_back(std::move(row));
  return rows;
}

std::vector<Option<PoolConf>> caching_pool_options() {
  using C = PoolConf;
  return {
      size_option<C>(
          "granularity",
          "segments are multiples of this (a power of two, at least 4KiB); "
          "raises min_segment and huge_threshold when they are not given.",
          [](auto& c) -> auto& { return c.pool.segment_granularity; }),
      size_option<C>(
          "min_segment", "smallest segment asked of the backend.",
          [](auto& c) -> auto& { return c.pool.min_segment_size; }),
      size_option<C>(
          "huge_threshold", "requests this big get a segment of their own.",
          [](auto& c) -> auto& { return c.pool.huge_threshold; }),
      size_option<C>(
          "small_pool",
          "while the pool holds less than this, segments are multiples of "
          "small_granularity instead; `0`: off.",
          [](auto& c) -> auto& { return c.pool.small_pool_limit; }),
      size_option<C>(
          "small_granularity",
          "what segments of a small pool are multiples of (a power of two, at least "
          "4KiB; at most granularity).",
          [](auto& c) -> auto& { return c.pool.small_granularity; }),
      size_option<C>(
          "initial_reservation", "one segment taken when the pool is created, and kept.",
          [](auto& c) -> auto& { return c.pool.initial_reservation; }),
      bool_option<C>(
          "release_before_growth",
          "before growing past its previous peak, the pool returns its wholly "
          "free segments to the backend.",
          [](auto& c) -> auto& { return c.pool.release_cached_before_growth; }),
      bool_option<C>(
          "consolidate",
          "a stream that becomes empty while holding two or more segments has "
          "them replaced by one segment of the size it needed at its peak.",
          [](auto& c) -> auto& { return c.pool.consolidate_when_empty; }),
      bool_option<C>(
          "spare_pages",
          "the segments released to grow that the new one does not need are kept aside, and "
          "the next new segment or arena takes their pages instead of fresh ones (host "
          "memory: no page faults again); never more than the segments' peak.",
          [](auto& c) -> auto& { return c.pool.keep_spare_pages; }),
      bool_option<C>(
          "grow_arena",
          "a miss after consolidation grows the arena in place (where the backend can: host "
          "memory) instead of taking a segment beside it, so a larger shape (the VAE after "
          "the UNet, a higher resolution) does not hold arena and segment for good.",
          [](auto& c) -> auto& { return c.pool.grow_arena; }),
      bool_option<C>(
          "cut_free_ends",
          "before the pool grows past its peak, the free pages at the ends of segments that "
          "still hold tensors are cut off and given to the new segment (where the backend "
          "can: host memory); where an arena would grow by more than 1/16, its free pages "
          "between tensors too.",
          [](auto& c) -> auto& { return c.pool.cut_free_ends; }),
  };
}

PlannedArenaOptions planned_arena_options(const PoolConf& conf) {
  PlannedArenaOptions options;
  options.replan_after_divergent_steps = conf.replan_after;
  options.max_plans = conf.max_plans;
  options.planner_max_search_nodes = conf.plan_nodes;
  options.fallback = conf.pool;
  return options;
}

void raise_to_granularity(PoolConf& conf, const KeySet& given) {
  const std::size_t granularity = conf.pool.segment_granularity;
  if (!given.contains("min_segment") && conf.pool.min_segment_size < granularity) {
    conf.pool.min_segment_size = granularity;
  }
  if (!given.contains("huge_threshold") && conf.pool.huge_threshold < granularity) {
    conf.pool.huge_threshold = granularity;
  }
}

void validate_pool_conf(std::string_view name, const PoolConf& conf) {
  try {
    conf.pool.validate();
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(std::string(name) + ": " + e.what());
  }
}

}  // namespace sdalloc::config
