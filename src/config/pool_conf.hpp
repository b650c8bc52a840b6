// pool_conf.hpp - the settings every front end's pool shares, and their SDALLOC_CONF rows.
//
// A front end (the PyTorch shim, a malloc drop-in) derives its config struct from PoolConf
// and lifts pool_options() into its own OptionTable, so `mode`, `capacity`, the caching
// pool's options, `replan_after`, `max_plans` and `plan_nodes` are spelled, typed, checked and
// documented once. Each front end says which modes it serves (the kMode* names; the shim adds
// async), and its finish hook calls raise_to_granularity() then, after its own checks,
// validate_pool_conf().
#pragma once

#include <cstddef>
#include <vector>

#include "config/option_table.hpp"
#include "sdalloc/policies/caching_pool.hpp"
#include "sdalloc/policies/planned_arena.hpp"

namespace sdalloc::config {

// Every mode any front end offers; a front end's `mode` row lists the ones it serves.
enum class PoolMode { kPool, kAsync, kVmm, kPlanned };

struct PoolConf {
  PoolMode mode = PoolMode::kPool;
  std::size_t capacity = 0;      // bytes one pool may hold; 0: no cap
  CachingPoolOptions pool;       // granularity, segments, growth policy
  std::size_t replan_after = 3;  // mode:planned: divergent steps in a row before re-recording
  std::size_t max_plans = 4;     // mode:planned: plans kept at once (kinds of step)
  std::size_t plan_nodes = 0;    // mode:planned: search nodes per plan; 0: only the time limit
};

// The `mode` names (with their documentation) a front end picks from.
extern const EnumName kModePool;
extern const EnumName kModeVmm;
extern const EnumName kModePlanned;

// The shared rows, in the order format() writes them: mode (with `modes`, in that order),
// capacity, replan_after, max_plans, plan_nodes, then caching_pool_options().
std::vector<Option<PoolConf>> pool_options(std::vector<EnumName> modes);
// The rows that set PoolConf::pool (CachingPoolOptions) only: granularity, min_segment,
// huge_threshold, small_pool, small_granularity, initial_reservation,
// release_before_growth, consolidate, spare_pages, grow_arena. A front end that runs a
// caching pool of its own (`sdalloc replay --pool-conf`) takes these and nothing else.
std::vector<Option<PoolConf>> caching_pool_options();

// mode:planned's PlannedArenaOptions from the shared rows (replan_after, max_plans,
// plan_nodes, the caching pool's options for the fallback pool); the front end sets what is
// its own (prefault_host_arena: it knows whether its memory is the host's).
PlannedArenaOptions planned_arena_options(const PoolConf& conf);

// A granularity given without min_segment / huge_threshold raises those to at least the
// granularity, rather than making the user repeat it. `given`: the keys the text set.
void raise_to_granularity(PoolConf& conf, const KeySet& given);
// The caching pool's own checks (CachingPoolOptions::validate), as InvalidArgument
// "<name>: CachingPoolOptions: ...".
void validate_pool_conf(std::string_view name, const PoolConf& conf);

}  // namespace sdalloc::config
