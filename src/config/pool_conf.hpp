// pool_conf.hpp - the rows every front end's pool shares: one option table for PoolConf.
//
// PoolConf (sdalloc/config/make_pool.hpp) is what make_pool() builds from. Its fields are
// spelled here once, as option rows: the SDALLOC_CONF key, the type, the help text and the
// default (PoolConf{}'s). A front end (the PyTorch shim, the CPU drop-in) derives its config
// struct from PoolConf and lifts pool_options() into its own OptionTable; the C API maps
// each row to a field of sdalloc_pool_config_t (c_api/c_config.cpp, whose defaults are
// PoolConf{}'s, a test checks every row has one); the Python package passes the C fields;
// the docs' tables are the tables' markdown(), which tests keep equal. Each front end says
// which modes it serves (the kMode* names), and its finish hook calls
// raise_to_granularity() then, after its own checks, validate_pool_conf().
//
// Retired keys (retired_pool_options): keys of the segment cache's host-only half and its
// per-shape rules, removed when pages became the unit wherever memory is virtual; accepted,
// ignored, and warned about, so old scripts keep working.
#pragma once

#include <string_view>
#include <vector>

#include "config/option_table.hpp"
#include "sdalloc/config/make_pool.hpp"

namespace sdalloc::config {

using ::sdalloc::PoolConf;
using ::sdalloc::PoolMode;

// The `mode` names (with their documentation) a front end picks from.
extern const EnumName kModeAuto;
extern const EnumName kModePool;
extern const EnumName kModeVmm;
extern const EnumName kModePlanned;

// The shared rows, in the order format() writes them: mode (with `modes`, in that order),
// capacity, replan_after, max_plans, plan_nodes, caching_pool_options(), then the retired
// keys.
std::vector<Option<PoolConf>> pool_options(std::vector<EnumName> modes);
// The rows that set PoolConf::pool (CachingPoolOptions) only: granularity, min_segment,
// huge_threshold, initial_reservation, release_before_growth, consolidate. A front end that
// runs a caching pool of its own (`sdalloc replay --pool-conf`) takes these (and the retired
// keys) and nothing else.
std::vector<Option<PoolConf>> caching_pool_options();
// small_pool, small_granularity, spare_pages, grow_arena, cut_free_ends.
std::vector<Option<PoolConf>> retired_pool_options();

// A granularity given without min_segment / huge_threshold raises those to at least the
// granularity, rather than making the user repeat it. `given`: the keys the text set.
void raise_to_granularity(PoolConf& conf, const KeySet& given);
// The caching pool's own checks (CachingPoolOptions::validate), as InvalidArgument
// "<name>: CachingPoolOptions: ...".
void validate_pool_conf(std::string_view name, const PoolConf& conf);

}  // namespace sdalloc::config
