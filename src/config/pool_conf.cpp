// pool_conf.cpp - the shared pool rows of SDALLOC_CONF: their names, types and help.
#include "config/pool_conf.hpp"

#include <string>
#include <utility>

namespace sdalloc::config {

const EnumName kModeAuto{"auto", static_cast<int>(PoolMode::kAuto),
                         "vmm where the memory can be mapped page by page, pool otherwise"};
const EnumName kModePool{"pool", static_cast<int>(PoolMode::kPool),
                         "a CachingPool, the segment cache, over the backend's whole segments "
                         "(cudaMalloc, mmap)"};
const EnumName kModeVmm{"vmm", static_cast<int>(PoolMode::kVmm),
                        "a VirtualMemoryPool: physical pages mapped into reserved address "
                        "ranges and moved under the requests that need them (CUDA's cuMem "
                        "API; host: anonymous pages)"};
const EnumName kModePlanned{"planned", static_cast<int>(PoolMode::kPlanned),
                            "a repeated step served from one planned arena, other requests "
                            "from a CachingPool (see Planned steps)"};

std::vector<Option<PoolConf>> pool_options(std::vector<EnumName> modes) {
  using C = PoolConf;
  std::vector<Option<PoolConf>> rows = {
      enum_option<C>(
          "mode", "which pool serves the requests.", std::move(modes),
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
  std::vector<Option<PoolConf>> rows = {
      size_option<C>(
          "granularity",
          "`mode:pool`: segments are multiples of this (a power of two, at least 4KiB); "
          "raises min_segment and huge_threshold when they are not given.",
          [](auto& c) -> auto& { return c.pool.segment_granularity; }),
      size_option<C>(
          "min_segment", "`mode:pool`: smallest segment asked of the backend.",
          [](auto& c) -> auto& { return c.pool.min_segment_size; }),
      size_option<C>(
          "huge_threshold",
          "`mode:pool`: requests this big get a segment of their own, reused only by "
          "requests of about their size.",
          [](auto& c) -> auto& { return c.pool.huge_threshold; }),
      size_option<C>(
          "initial_reservation",
          "`mode:pool`: one segment taken when the pool is created, and kept.",
          [](auto& c) -> auto& { return c.pool.initial_reservation; }),
      bool_option<C>(
          "release_before_growth",
          "`mode:pool`: before growing past its previous peak, the pool returns its wholly "
          "free segments to the backend.",
          [](auto& c) -> auto& { return c.pool.release_cached_before_growth; }),
      bool_option<C>(
          "consolidate",
          "`mode:pool`: a stream that released segments to grow has its free segments "
          "replaced by one arena of its peak size once its work has gone through a whole "
          "cycle (a step of a loop).",
          [](auto& c) -> auto& { return c.pool.consolidate_when_empty; }),
  };
  for (Option<PoolConf>& row : retired_pool_options()) rows.push_back(std::move(row));
  return rows;
}

std::vector<Option<PoolConf>> retired_pool_options() {
  constexpr std::string_view kWhy =
      "retired in 0.2: where memory is virtual, vmm moves pages; docs/pools.md";
  return {
      retired_option<PoolConf>("small_pool", kWhy),
      retired_option<PoolConf>("small_granularity", kWhy),
      retired_option<PoolConf>("spare_pages", kWhy),
      retired_option<PoolConf>("grow_arena", kWhy),
      retired_option<PoolConf>("cut_free_ends", kWhy),
  };
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
