// The greedy placements: take buffers in one order and put each at the lowest aligned
// offset (or, for best fit, into the tightest gap) left free by the time-conflicting
// buffers already placed. These are TFLite's arena planner (largest first, lowest offset)
// and XLA's heap simulator (largest first, best fit), plus lifetime and area orders.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <utility>
#include <vector>

#include "sdalloc/planner/planner.hpp"

namespace sdalloc {
namespace {

std::uint64_t align_up(std::uint64_t value, std::uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

std::vector<std::size_t> order_of(std::span<const Buffer> buffers, GreedyOrder order) {
  std::vector<std::size_t> indices(buffers.size());
  std::iota(indices.begin(), indices.end(), std::size_t{0});
  const auto lifetime = [&](std::size_t i) {
    return static_cast<std::uint64_t>(buffers[i].upper - buffers[i].lower);
  };
  // Ties go to the earlier-starting buffer, then to input order, so plans are reproducible.
  const auto key = [&](std::size_t i) -> std::pair<std::uint64_t, std::uint64_t> {
    switch (order) {
      case GreedyOrder::kLifetime:
        return {lifetime(i), buffers[i].size};
      case GreedyOrder::kArea:
        return {lifetime(i) * buffers[i].size, buffers[i].size};
      case GreedyOrder::kSize:
      case GreedyOrder::kBestFit:
        break;
    }
    return {buffers[i].size, lifetime(i)};
  };
  std::stable_sort(indices.begin(), indices.end(), [&](std::size_t a, std::size_t b) {
    const auto ka = key(a);
    const auto kb = key(b);
    if (ka != kb) return ka > kb;
    return buffers[a].lower < buffers[b].lower;
  });
  return indices;
}

}  // namespace

Plan plan_greedy(std::span<const Buffer> buffers, GreedyOrder order) {
  check_buffers(buffers);
  Plan plan;
  plan.offsets.assign(buffers.size(), 0);
  std::vector<std::size_t> placed;
  placed.reserve(buffers.size());
  std::vector<std::pair<std::uint64_t, std::uint64_t>> taken;  // (offset, end) of conflicts
  for (const std::size_t i : order_of(buffers, order)) {
    const Buffer& b = buffers[i];
    taken.clear();
    for (const std::size_t j : placed) {
      if (buffers[j].lower < b.upper && b.lower < buffers[j].upper) {
        taken.emplace_back(plan.offsets[j], plan.offsets[j] + buffers[j].size);
      }
    }
    std::sort(taken.begin(), taken.end());
    std::uint64_t cursor = 0;  // everything below is either taken or a gap already rejected
    std::uint64_t best_offset = std::numeric_limits<std::uint64_t>::max();
    std::uint64_t best_gap = std::numeric_limits<std::uint64_t>::max();
    for (const auto& [start, end] : taken) {
      const std::uint64_t candidate = align_up(cursor, b.alignment);
      if (candidate + b.size <= start) {
        const std::uint64_t gap = start - cursor;
        if (order != GreedyOrder::kBestFit) {
          best_offset = candidate;
          break;
        }
        if (gap < best_gap) {
          best_gap = gap;
          best_offset = candidate;
        }
      }
      cursor = std::max(cursor, end);
    }
    if (best_offset == std::numeric_limits<std::uint64_t>::max()) {
      best_offset = align_up(cursor, b.alignment);
    }
    plan.offsets[i] = best_offset;
    plan.arena_size = std::max(plan.arena_size, best_offset + b.size);
    placed.push_back(i);
  }
  return plan;
}

}  // namespace sdalloc
