// Checks on interval problems and plans: input well-formedness, the live-bytes lower bound,
// and the validator that proves no two time-conflicting buffers share memory.
#include <algorithm>
#include <compare>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/planner/planner.hpp"

namespace sdalloc {
namespace {

std::string describe(const Buffer& b) {
  return "buffer " + std::to_string(b.id) + " [" + std::to_string(b.lower) + ", " +
         std::to_string(b.upper) + ")";
}

// A time event of the sweep. At equal times frees (upper) come before allocations (lower),
// because [a, t) and [t, b) do not conflict; the time and the kind are kept apart (no
// time * 2 + kind, which overflows for times past 2^62).
struct SweepEvent {
  std::int64_t time;
  bool is_start;
  std::size_t index;
  auto operator<=>(const SweepEvent&) const = default;
};

// Times spread over at most this many units per sweep event are sorted by counting: a
// recorded step's times are its event indices, so plans made at run time (PlannedArena)
// sort in linear time, with a table of four counters per event.
constexpr std::uint64_t kDenseTimesPerEvent = 2;

std::vector<SweepEvent> sweep_order(std::span<const Buffer> buffers) {
  std::vector<SweepEvent> events;
  events.reserve(buffers.size() * 2);
  std::int64_t first = std::numeric_limits<std::int64_t>::max();
  std::int64_t last = std::numeric_limits<std::int64_t>::min();
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    events.push_back(SweepEvent{.time = buffers[i].lower, .is_start = true, .index = i});
    events.push_back(SweepEvent{.time = buffers[i].upper, .is_start = false, .index = i});
    first = std::min(first, buffers[i].lower);
    last = std::max(last, buffers[i].upper);
  }
  // Both lie within +-2^62 (check_buffers), so the span fits an unsigned 64-bit integer.
  const std::uint64_t span =
      events.empty() ? 0 : static_cast<std::uint64_t>(last) - static_cast<std::uint64_t>(first);
  if (events.empty() || span / kDenseTimesPerEvent > events.size() ||
      events.size() >= std::numeric_limits<std::uint32_t>::max()) {
    std::sort(events.begin(), events.end());
    return events;
  }
  // Key (time - first) * 2 + is_start orders as (time, is_start); the events went in by
  // index, and a counting sort keeps that order among equal keys: the order std::sort gives.
  const auto key = [first](const SweepEvent& e) {
    return static_cast<std::size_t>(static_cast<std::uint64_t>(e.time) -
                                    static_cast<std::uint64_t>(first)) *
               2 +
           (e.is_start ? 1 : 0);
  };
  std::vector<std::uint32_t> starts(static_cast<std::size_t>(span) * 2 + 3, 0);
  for (const SweepEvent& e : events) ++starts[key(e) + 1];
  for (std::size_t k = 1; k < starts.size(); ++k) starts[k] += starts[k - 1];
  std::vector<SweepEvent> sorted(events.size());
  for (const SweepEvent& e : events) sorted[starts[key(e)]++] = e;
  return sorted;
}

}  // namespace

void check_buffers(std::span<const Buffer> buffers) {
  // Ids below twice the count (a recorded step numbers its buffers 0, 1, ...) are checked
  // against a table; others by hashing.
  const std::size_t dense_ids = buffers.size() * 2;
  std::vector<bool> seen_dense(dense_ids, false);
  std::unordered_map<std::uint64_t, std::size_t> seen;
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    const Buffer& b = buffers[i];
    if (b.upper <= b.lower) {
      throw InvalidArgument(describe(b) + ": upper must be greater than lower");
    }
    if (b.lower < -kMaxTime || b.upper > kMaxTime) {
      throw InvalidArgument(describe(b) + ": times must lie within +-2^62");
    }
    if (b.size == 0) throw InvalidArgument(describe(b) + ": size must be positive");
    if (b.alignment == 0 || (b.alignment & (b.alignment - 1)) != 0) {
      throw InvalidArgument(describe(b) + ": alignment " + std::to_string(b.alignment) +
                            " is not a power of two");
    }
    const bool duplicate = b.id < dense_ids ? seen_dense[b.id] : !seen.emplace(b.id, i).second;
    if (duplicate) throw InvalidArgument("duplicate buffer id " + std::to_string(b.id));
    if (b.id < dense_ids) seen_dense[b.id] = true;
  }
}

std::uint64_t lower_bound(std::span<const Buffer> buffers) {
  std::uint64_t live = 0;
  std::uint64_t peak = 0;
  for (const SweepEvent& event : sweep_order(buffers)) {
    const Buffer& b = buffers[event.index];
    if (event.is_start) {
      if (__builtin_add_overflow(live, b.size, &live)) {
        throw InvalidArgument("the buffers live with " + describe(b) +
                              " need more than 2^64 - 1 bytes together");
      }
      peak = std::max(peak, live);
    } else {
      live -= b.size;  // was added: cannot wrap
    }
  }
  return peak;
}

void validate(std::span<const Buffer> buffers, const Plan& plan) {
  if (plan.offsets.size() != buffers.size()) {
    throw InvalidArgument("plan has " + std::to_string(plan.offsets.size()) + " offsets for " +
                          std::to_string(buffers.size()) + " buffers");
  }
  std::uint64_t arena = 0;
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    const Buffer& b = buffers[i];
    if (b.alignment != 0 && plan.offsets[i] % b.alignment != 0) {
      throw InvalidArgument(describe(b) + ": offset " + std::to_string(plan.offsets[i]) +
                            " is not a multiple of its alignment " + std::to_string(b.alignment));
    }
    std::uint64_t end = 0;
    if (__builtin_add_overflow(plan.offsets[i], b.size, &end)) {
      throw InvalidArgument(describe(b) + ": offset " + std::to_string(plan.offsets[i]) +
                            " + size " + std::to_string(b.size) + " passes 2^64 - 1");
    }
    arena = std::max(arena, end);
  }
  if (arena != plan.arena_size) {
    throw InvalidArgument("plan reports arena size " + std::to_string(plan.arena_size) +
                          " but its buffers reach " + std::to_string(arena));
  }
  // Sweep over time keeping the live buffers ordered by offset. Live buffers never overlap
  // one another (checked as each one arrives), so a newcomer only has to be compared with
  // its neighbours in offset order: the one starting at or below it and the one above.
  std::set<std::pair<std::uint64_t, std::size_t>> live;  // (offset, index)
  // Every offset + size was checked above, so the ends below cannot wrap.
  for (const SweepEvent& event : sweep_order(buffers)) {
    const std::size_t index = event.index;
    const std::pair<std::uint64_t, std::size_t> entry{plan.offsets[index], index};
    if (!event.is_start) {
      live.erase(entry);
      continue;
    }
    const std::uint64_t start = entry.first;
    const std::uint64_t end = start + buffers[index].size;
    auto above = live.lower_bound(entry);
    auto conflict = live.end();
    if (above != live.end() && above->first < end) conflict = above;
    if (conflict == live.end() && above != live.begin()) {
      const auto below = std::prev(above);
      if (below->first + buffers[below->second].size > start) conflict = below;
    }
    if (conflict != live.end()) {
      const Buffer& a = buffers[conflict->second];
      const Buffer& b = buffers[index];
      throw InvalidArgument("buffers " + std::to_string(a.id) + " and " + std::to_string(b.id) +
                            " are live at the same time and overlap in memory (" + describe(a) +
                            " at offset " + std::to_string(conflict->first) + ", " + describe(b) +
                            " at offset " + std::to_string(start) + ")");
    }
    live.insert(entry);
  }
}

}  // namespace sdalloc
