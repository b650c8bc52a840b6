// c_config.cpp - sdalloc_pool_config_t and PoolConf, one to the other (c_config.hpp).
#include "c_api/c_config.hpp"

#include <cstddef>
#include <cstring>
#include <string>

#include "c_api/boundary.hpp"
#include "sdalloc/core/errors.hpp"
#include "sdalloc/resources/host_backend.hpp"

namespace sdalloc::c_api_detail {
namespace {

// What the retired fields held before they were retired; sdalloc_pool_config_init still
// sets them, so a caller that never touches them is not warned.
constexpr std::size_t kRetiredSmallPoolLimit = std::size_t{64} << 20;
constexpr std::size_t kRetiredSmallGranularity = std::size_t{128} << 10;

PoolMode mode_of(std::int32_t raw) {
  switch (raw) {
    case SDALLOC_MODE_AUTO:
      return PoolMode::kAuto;
    case SDALLOC_MODE_POOL:
      return PoolMode::kPool;
    case SDALLOC_MODE_VMM:
      return PoolMode::kVmm;
    case SDALLOC_MODE_PLANNED:
      return PoolMode::kPlanned;
    case SDALLOC_MODE_ASYNC:
      return PoolMode::kAsync;
    default:
      throw InvalidArgument("unknown mode " + std::to_string(raw) +
                            " (SDALLOC_MODE_AUTO, _POOL, _VMM, _PLANNED or _ASYNC)");
  }
}

}  // namespace

sdalloc_pool_mode_t c_mode_of(PoolMode mode) {
  switch (mode) {
    case PoolMode::kPool:
      return SDALLOC_MODE_POOL;
    case PoolMode::kAsync:
      return SDALLOC_MODE_ASYNC;
    case PoolMode::kVmm:
      return SDALLOC_MODE_VMM;
    case PoolMode::kPlanned:
      return SDALLOC_MODE_PLANNED;
    case PoolMode::kAuto:
      break;
  }
  return SDALLOC_MODE_AUTO;
}

sdalloc_pool_config_t config_of(const PoolConf& conf) {
  sdalloc_pool_config_t c;
  std::memset(&c, 0, sizeof c);  // padding too, so configs compare bytewise
  c.struct_size = sizeof c;
  c.resource = SDALLOC_RESOURCE_HOST;
  c.capacity = conf.capacity;
  c.initial_reservation = conf.pool.initial_reservation;
  c.segment_granularity = conf.pool.segment_granularity;
  c.min_segment_size = conf.pool.min_segment_size;
  c.huge_threshold = conf.pool.huge_threshold;
  c.release_cached_before_growth = conf.pool.release_cached_before_growth;
  c.consolidate_when_empty = conf.pool.consolidate_when_empty;
  c.replan_after_divergent_steps = conf.replan_after;
  c.planned = false;
  c.max_plans = conf.max_plans;
  c.planner_max_search_nodes = conf.plan_nodes;
  c.small_pool_limit = kRetiredSmallPoolLimit;
  c.small_granularity = kRetiredSmallGranularity;
  c.keep_spare_pages = true;
  c.grow_arena = true;
  c.cut_free_ends = true;
  c.mode = c_mode_of(conf.mode);
  return c;
}

sdalloc_pool_config_t config_defaults() { return config_of(PoolConf{}); }

PoolConf pool_conf_of(const sdalloc_pool_config_t& c, std::size_t given,
                      std::vector<std::string>& warnings) {
  PoolConf conf;
  conf.capacity = c.capacity;
  conf.pool.initial_reservation = c.initial_reservation;
  conf.pool.segment_granularity = c.segment_granularity;
  conf.pool.min_segment_size = c.min_segment_size;
  conf.pool.huge_threshold = c.huge_threshold;
  conf.pool.release_cached_before_growth = c.release_cached_before_growth;
  conf.pool.consolidate_when_empty = c.consolidate_when_empty;
  conf.replan_after = c.replan_after_divergent_steps;
  conf.max_plans = c.max_plans;
  conf.plan_nodes = c.planner_max_search_nodes;
  const bool has_mode = given >= offsetof(sdalloc_pool_config_t, mode) + sizeof c.mode;
  conf.mode = has_mode ? mode_of(raw_value(c.mode)) : PoolMode::kPool;
  if (c.planned) {
    if (has_mode && conf.mode != PoolMode::kAuto && conf.mode != PoolMode::kPlanned) {
      throw InvalidArgument("config.planned is true but config.mode is " + to_string(conf.mode) +
                            " (set one: mode SDALLOC_MODE_PLANNED is the same as planned)");
    }
    conf.mode = PoolMode::kPlanned;
  }
  const auto retired = [&](const char* field, bool changed) {
    if (changed) {
      warnings.push_back(std::string("config.") + field +
                         " no longer has any effect and is ignored (retired in 0.2: where "
                         "memory is virtual, mode VMM moves pages; docs/pools.md)");
    }
  };
  const auto covers = [&](std::size_t end) { return given >= end; };
  if (covers(offsetof(sdalloc_pool_config_t, small_granularity))) {
    retired("small_pool_limit", c.small_pool_limit != kRetiredSmallPoolLimit);
  }
  if (covers(offsetof(sdalloc_pool_config_t, keep_spare_pages))) {
    retired("small_granularity", c.small_granularity != kRetiredSmallGranularity);
  }
  if (covers(offsetof(sdalloc_pool_config_t, grow_arena))) {
    retired("keep_spare_pages", !c.keep_spare_pages);
  }
  if (covers(offsetof(sdalloc_pool_config_t, cut_free_ends))) {
    retired("grow_arena", !c.grow_arena);
  }
  if (covers(offsetof(sdalloc_pool_config_t, cut_free_ends) + sizeof c.cut_free_ends)) {
    retired("cut_free_ends", !c.cut_free_ends);
  }
  return conf;
}

MemoryBackend backend_of(const sdalloc_pool_config_t& config) {
  const std::int32_t resource = raw_value(config.resource);
  switch (resource) {
    case SDALLOC_RESOURCE_HOST:
      return host_backend();
    case SDALLOC_RESOURCE_HOST_HUGEPAGES:
      return host_backend({.transparent_huge_pages = true});
    default:
      throw InvalidArgument(
          "unknown resource kind " + std::to_string(resource) +
          " (this build offers SDALLOC_RESOURCE_HOST and SDALLOC_RESOURCE_HOST_HUGEPAGES)");
  }
}

}  // namespace sdalloc::c_api_detail
