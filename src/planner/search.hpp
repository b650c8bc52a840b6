// planner/search.hpp - the canonical search behind plan(), after MiniMalloc (Moffitt, ASPLOS
// 2023). Internal to the library; see search.cpp for the method.
#pragma once

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

// Where a search stops without an answer (kTimedOut): at the deadline, or after max_nodes
// nodes (0: no node limit).
struct SearchLimits {
  std::chrono::steady_clock::time_point deadline;
  std::uint64_t max_nodes = 0;
};

// Looks for a plan with arena_size <= capacity within `limits`. kInfeasible is a proof that
// none exists. `tick` is called every few hundred nodes with the nodes visited so far.
SearchResult search_within(std::span<const Buffer> buffers, std::uint64_t capacity,
                           const SearchLimits& limits,
                           const std::function<void(std::uint64_t)>& tick);

}  // namespace sdalloc::planner_detail
