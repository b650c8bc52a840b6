// The greedy placements: take buffers in one order and put each at the lowest aligned
// offset (or, for best fit, into the tightest gap) left free by the time-conflicting
// buffers already placed. These are TFLite's arena planner (largest first, lowest offset)
// and XLA's heap simulator (largest first, best fit), plus lifetime and area orders.
//
// Finding the conflicts: time is renumbered so that buffer b covers the integer points
// [start(b), end(b)): start(b) is b's rank among the buffers sorted by lower (ties by
// input order, so every start is distinct) and end(b) the number of buffers whose lower is
// below b.upper. Two buffers then conflict exactly when their point ranges intersect, i.e.
// placed a conflicts with b iff start(a) < end(b) and end(a) > start(b). A max-tree over
// start positions holds end(a) for each placed a (0: not placed), so the conflicts of b are
// the positions left of end(b) whose value passes start(b): found by descending only into
// subtrees whose maximum passes it, O((k + 1) log n) for k conflicts. Each buffer then
// costs O(log n + k log k) instead of a scan over every placed buffer, and the plans are
// exactly those of that scan (the conflicts are sorted by (offset, end) the same way).
#include "planner/heuristics.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <utility>
#include <vector>

#include "planner/offsets.hpp"
#include "sdalloc/planner/planner.hpp"

namespace sdalloc::planner_detail {
namespace {

using Clock = std::chrono::steady_clock;

// Buffers placed between two looks at the clock; the first look is after the first batch,
// so a small problem always gets its whole greedy plan, even with no time at all.
constexpr std::size_t kClockEvery = 1024;

std::vector<std::size_t> order_of(std::span<const Buffer> buffers, GreedyOrder order) {
  // Ties go to the earlier-starting buffer, then to input order, so plans are reproducible.
  // The keys are computed once, and the index ends every comparison (a total order: no
  // stable sort needed).
  struct Ranked {
    std::uint64_t first;
    std::uint64_t second;
    std::int64_t lower;
    std::size_t index;
  };
  std::vector<Ranked> ranked(buffers.size());
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    const Buffer& b = buffers[i];
    const std::uint64_t lifetime = lifetime_of(b.lower, b.upper);
    Ranked& r = ranked[i];
    r.lower = b.lower;
    r.index = i;
    switch (order) {
      case GreedyOrder::kLifetime:
        r.first = lifetime;
        r.second = b.size;
        break;
      case GreedyOrder::kArea:
        r.first = saturating_mul(lifetime, b.size);
        r.second = b.size;
        break;
      case GreedyOrder::kSize:
      case GreedyOrder::kBestFit:
        r.first = b.size;
        r.second = lifetime;
        break;
    }
  }
  std::sort(ranked.begin(), ranked.end(), [](const Ranked& a, const Ranked& b) {
    if (a.first != b.first) return a.first > b.first;
    if (a.second != b.second) return a.second > b.second;
    if (a.lower != b.lower) return a.lower < b.lower;
    return a.index < b.index;
  });
  std::vector<std::size_t> indices(buffers.size());
  for (std::size_t n = 0; n < ranked.size(); ++n) indices[n] = ranked[n].index;
  return indices;
}

// ---- the conflict index: placed buffers by renumbered time ------------------------------

class ConflictIndex {
 public:
  explicit ConflictIndex(std::span<const Buffer> buffers)
      : start_(buffers.size()), end_(buffers.size()) {
    std::vector<std::size_t> by_lower(buffers.size());
    std::iota(by_lower.begin(), by_lower.end(), std::size_t{0});
    // A recorded step lists its buffers in the order they start: nothing to sort then.
    const auto starts_earlier = [&](std::size_t a, std::size_t b) {
      return buffers[a].lower < buffers[b].lower;
    };
    if (!std::is_sorted(by_lower.begin(), by_lower.end(), starts_earlier)) {
      std::stable_sort(by_lower.begin(), by_lower.end(), starts_earlier);
    }
    std::vector<std::int64_t> lowers(buffers.size());
    for (std::size_t r = 0; r < by_lower.size(); ++r) {
      start_[by_lower[r]] = static_cast<std::uint32_t>(r);
      lowers[r] = buffers[by_lower[r]].lower;
    }
    for (std::size_t i = 0; i < buffers.size(); ++i) {
      end_[i] = static_cast<std::uint32_t>(
          std::lower_bound(lowers.begin(), lowers.end(), buffers[i].upper) - lowers.begin());
    }
    while (leaves_ < buffers.size()) leaves_ *= 2;
    max_end_.assign(2 * leaves_, 0);
    owner_.assign(buffers.size(), 0);
    for (std::size_t r = 0; r < by_lower.size(); ++r) owner_[r] = by_lower[r];
  }

  void insert(std::size_t i) {
    std::size_t node = leaves_ + start_[i];
    max_end_[node] = end_[i];
    for (node /= 2; node >= 1; node /= 2) {
      max_end_[node] = std::max(max_end_[2 * node], max_end_[2 * node + 1]);
    }
  }

  // Appends the placed buffers that conflict with buffer i.
  void conflicts_of(std::size_t i, std::vector<std::size_t>& out) const {
    collect(1, 0, leaves_, end_[i], start_[i], out);
  }

 private:
  // Positions p < limit in the node's range [lo, hi) whose end passes `after`.
  void collect(std::size_t node, std::size_t lo, std::size_t hi, std::uint32_t limit,
               std::uint32_t after, std::vector<std::size_t>& out) const {
    if (lo >= limit || max_end_[node] <= after) return;
    if (hi - lo == 1) {
      out.push_back(owner_[lo]);
      return;
    }
    const std::size_t mid = lo + (hi - lo) / 2;
    collect(2 * node, lo, mid, limit, after, out);
    collect(2 * node + 1, mid, hi, limit, after, out);
  }

  std::vector<std::uint32_t> start_;    // per buffer: first point it covers
  std::vector<std::uint32_t> end_;      // per buffer: first point it no longer covers
  std::vector<std::size_t> owner_;      // per start position: the buffer starting there
  std::size_t leaves_ = 1;              // a power of two >= the number of buffers
  std::vector<std::uint32_t> max_end_;  // heap-ordered: max end of the placed buffers below
};

// The buffers left when the deadline passed go one over another above the rest.
void stack_the_rest(std::span<const Buffer> buffers, std::span<const std::size_t> rest,
                    Plan& plan) {
  for (const std::size_t i : rest) {
    plan.offsets[i] = align_up(plan.arena_size, buffers[i].alignment);
    plan.arena_size = end_of(plan.offsets[i], buffers[i].size);
  }
}

}  // namespace

GreedyResult greedy_within(std::span<const Buffer> buffers, GreedyOrder order,
                           Clock::time_point deadline) {
  if (buffers.size() >= std::numeric_limits<std::uint32_t>::max()) {
    throw InvalidArgument("the planner takes fewer than 2^32 - 1 buffers");
  }
  GreedyResult result;
  Plan& plan = result.plan;
  plan.offsets.assign(buffers.size(), 0);
  const std::vector<std::size_t> sequence = order_of(buffers, order);
  ConflictIndex index(buffers);
  std::vector<std::size_t> conflicts;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> taken;  // (offset, end) of conflicts
  for (std::size_t n = 0; n < sequence.size(); ++n) {
    if (n != 0 && n % kClockEvery == 0 && Clock::now() >= deadline) {
      stack_the_rest(buffers, std::span(sequence).subspan(n), plan);
      result.complete = false;
      return result;
    }
    const std::size_t i = sequence[n];
    const Buffer& b = buffers[i];
    conflicts.clear();
    index.conflicts_of(i, conflicts);
    taken.clear();
    for (const std::size_t j : conflicts) {
      taken.emplace_back(plan.offsets[j], plan.offsets[j] + buffers[j].size);  // checked below
    }
    std::sort(taken.begin(), taken.end());
    std::uint64_t cursor = 0;  // everything below is either taken or a gap already rejected
    std::uint64_t best_offset = kNoOffset;
    std::uint64_t best_gap = std::numeric_limits<std::uint64_t>::max();
    for (const auto& [start, end] : taken) {
      // A gap below a conflict is under 2^64 - 1, so the candidate's end is only computed
      // (checked) when the candidate is below `start`.
      const std::uint64_t candidate = align_up(cursor, b.alignment);
      if (candidate < start && b.size <= start - candidate) {
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
    if (best_offset == kNoOffset) best_offset = align_up(cursor, b.alignment);
    plan.offsets[i] = best_offset;
    plan.arena_size = std::max(plan.arena_size, end_of(best_offset, b.size));
    index.insert(i);
  }
  return result;
}

}  // namespace sdalloc::planner_detail

namespace sdalloc {

Plan plan_greedy(std::span<const Buffer> buffers, GreedyOrder order) {
  check_buffers(buffers);
  return planner_detail::greedy_within(buffers, order, std::chrono::steady_clock::time_point::max())
      .plan;
}

}  // namespace sdalloc
