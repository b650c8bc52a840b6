// planner/search.hpp - the canonical search behind plan(), after MiniMalloc (Moffitt, ASPLOS
// 2023). Internal to the library; see search.cpp for the method.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <span>

#include "sdalloc/planner/planner.hpp"  // Buffer, Plan

namespace sdalloc::planner_detail {

enum class SearchOutcome : std::uint8_t { kFound, kInfeasible, kTimedOut };

struct SearchResult {
  SearchOutcome outcome = SearchOutcome::kTimedOut;
  Plan plan;  // valid only when kFound
  std::uint64_t nodes = 0;
};

// How a search runs. It stops without an answer (kTimedOut) at the deadline, after
// max_nodes nodes (0: no node limit), or once *cancel is true (looked at with the clock,
// every few hundred nodes; nullptr: never). order_seed 0 ranks the buffers by MiniMalloc's
// static orders as they are; any other value scales each buffer's keys by its own factor
// within 1 +- 1/16 (a hash of the seed and the buffer), so ties and near-ties fall another
// way and the search walks another tree: the time the search takes to a plan is heavy-
// tailed, and short searches under new seeds (restarts) find what one long one does not.
struct SearchSettings {
  std::chrono::steady_clock::time_point deadline;
  std::uint64_t max_nodes = 0;
  const std::atomic<bool>* cancel = nullptr;
  std::uint64_t order_seed = 0;
};

// Looks for a plan with arena_size <= capacity within `settings`' limits. kInfeasible is a proof
// that none exists. `tick` is called every few hundred nodes with the nodes visited so far.
SearchResult search_within(std::span<const Buffer> buffers, std::uint64_t capacity,
                           const SearchSettings& settings,
                           const std::function<void(std::uint64_t)>& tick);

}  // namespace sdalloc::planner_detail
