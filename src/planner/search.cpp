// The canonical search (after MiniMalloc, Moffitt, ASPLOS 2023; our own implementation). A
// canonical plan puts every buffer at the lowest offset the time-conflicting buffers below
// it allow. Listed by (offset, rank in a static order), each buffer's offset is then the
// highest top of the conflicting buffers listed before it, so the search builds plans
// bottom-up: at each node any unplaced buffer may go next, at its lowest possible offset,
// provided (offset, rank) does not go below the previous placement's. Candidates are tried
// lowest offset first.
//
// Pruning:
//   section inference  time is cut into sections at every lower/upper; in each section the
//                      floor (the lowest offset still usable: the top of what is placed, or
//                      the lowest offset any unplaced buffer crossing it can take, if
//                      higher) plus the bytes of its unplaced buffers must fit the capacity,
//                      and no later buffer goes below the current offset (each section
//                      keeps a list of its unplaced buffers, so the floor's scan skips the
//                      placed ones, and stops once the floor could not prune);
//   dominance          a candidate above the top of some unplaced buffer placed as low as it
//                      can go would leave a gap under that buffer: skipped;
//   hatless buffers    a buffer no unplaced buffer shares time with constrains nothing; if
//                      placing it first fails, so does every other choice at this node;
//   decomposition      placing a buffer can leave time points no unplaced buffer spans; the
//                      parts on either side are then searched independently (and each is
//                      re-ranked with the section totals it has now).
// The static orders (by lifetime, area, fullest section crossed) are tried round robin with
// a node budget that doubles each round, as MiniMalloc does.
#include "planner/search.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <tuple>
#include <utility>
#include <vector>

#include "planner/deep_stack.hpp"
#include "planner/offsets.hpp"

namespace sdalloc::planner_detail {
namespace {

struct Item {
  std::size_t input;  // index in the caller's buffers
  std::uint64_t size;
  std::uint64_t alignment;
  std::uint64_t lifetime;
  std::uint32_t first_section;
  std::uint32_t end_section;  // exclusive
  std::vector<std::uint32_t> conflicts;
};

// The static orders tried in turn (MiniMalloc's "WAT", "TAW", "TWA"): by the fullest section
// the buffer crosses (T), its lifetime (W) and its area (A), all descending.
enum class Preorder : std::uint8_t { kWidthAreaTotal, kTotalAreaWidth, kTotalWidthArea };
constexpr Preorder kPreorders[] = {Preorder::kWidthAreaTotal, Preorder::kTotalAreaWidth,
                                   Preorder::kTotalWidthArea};

enum class Outcome : std::uint8_t { kFound, kInfeasible, kOutOfTime, kOutOfNodes };

// Problems this small are searched on the caller's stack (search_within).
constexpr std::size_t kBuffersOnCallersStack = 256;

// A set of unplaced buffers that no other unplaced buffer shares time with, over the
// sections [first_section, end_section): it can be solved on its own.
struct Partition {
  std::vector<std::uint32_t> members;
  std::uint32_t first_section;
  std::uint32_t end_section;
};

class ComponentSearch {
 public:
  ComponentSearch(const std::vector<Item>& items, std::uint32_t sections, std::uint64_t capacity,
                  const SearchSettings& settings, const std::function<void(std::uint64_t)>& tick,
                  std::uint64_t& nodes)
      : items_(items),
        capacity_(capacity),
        settings_(settings),
        tick_(tick),
        nodes_(nodes),
        unplaced_(sections),
        slot_base_(items.size(), 0),
        floor_(sections, 0),
        total_(sections, 0),
        cuts_(sections, 0),
        min_offset_(items.size(), 0),
        position_(items.size(), kUnplaced),
        solution_(items.size(), 0),
        rank_(items.size(), 0) {
    std::size_t slots = 0;
    for (std::uint32_t i = 0; i < items_.size(); ++i) {
      slot_base_[i] = slots;
      slots += items_[i].end_section - items_[i].first_section;
    }
    slot_.resize(slots);
    for (std::uint32_t i = 0; i < items_.size(); ++i) {
      for (std::uint32_t s = items_[i].first_section; s < items_[i].end_section; ++s) {
        slot_of(i, s) = static_cast<std::uint32_t>(unplaced_[s].size());
        unplaced_[s].push_back(i);
        total_[s] += items_[i].size;
      }
      for (std::uint32_t s = items_[i].first_section; s + 1 < items_[i].end_section; ++s) {
        ++cuts_[s];
      }
    }
  }

  Outcome run(Preorder preorder, std::uint64_t node_budget) {
    preorder_ = preorder;
    node_budget_ = node_budget;
    std::vector<std::uint32_t> all_items(items_.size());
    std::iota(all_items.begin(), all_items.end(), std::uint32_t{0});
    Partition all{.members = std::move(all_items),
                  .first_section = 0,
                  .end_section = static_cast<std::uint32_t>(floor_.size())};
    rank_partition(all);
    return descend(all, 0, 0);
  }

  // The offsets of the last plan found.
  const std::vector<std::uint64_t>& positions() const { return solution_; }

 private:
  static constexpr std::uint64_t kUnplaced = std::numeric_limits<std::uint64_t>::max();

  std::uint32_t& slot_of(std::uint32_t i, std::uint32_t s) {
    return slot_[slot_base_[i] + (s - items_[i].first_section)];
  }

  // Takes buffer i out of its sections' unplaced lists (its slots keep where it was).
  void take_out(std::uint32_t i) {
    for (std::uint32_t s = items_[i].first_section; s < items_[i].end_section; ++s) {
      std::vector<std::uint32_t>& list = unplaced_[s];
      const std::uint32_t k = slot_of(i, s);
      const std::uint32_t moved = list.back();
      list[k] = moved;
      slot_of(moved, s) = k;
      list.pop_back();
    }
  }

  // Undoes take_out(i); the lists must be as take_out(i) left them.
  void put_back(std::uint32_t i) {
    for (std::uint32_t s = items_[i].first_section; s < items_[i].end_section; ++s) {
      std::vector<std::uint32_t>& list = unplaced_[s];
      const std::uint32_t k = slot_of(i, s);
      if (k == list.size()) {
        list.push_back(i);
        continue;
      }
      const std::uint32_t moved = list[k];
      slot_of(moved, s) = static_cast<std::uint32_t>(list.size());
      list.push_back(moved);
      list[k] = i;
    }
  }

  // Static order of a partition's buffers, from the section totals as they are now: the
  // rank breaks ties between buffers that can go at the same offset.
  void rank_partition(const Partition& part) {
    using Key = std::tuple<std::uint64_t, std::uint64_t, std::uint64_t, std::uint32_t>;
    std::vector<std::pair<Key, std::uint32_t>> keyed;
    keyed.reserve(part.members.size());
    for (const std::uint32_t i : part.members) {
      const Item& item = items_[i];
      std::uint64_t fullest = 0;
      for (std::uint32_t s = item.first_section; s < item.end_section; ++s) {
        fullest = std::max(fullest, total_[s]);
      }
      const std::uint64_t scale = key_scale(item.input);
      const std::uint64_t lifetime = scaled(item.lifetime, scale);
      const std::uint64_t area = scaled(saturating_mul(item.size, item.lifetime), scale);
      fullest = scaled(fullest, scale);
      // Descending on the three criteria, then ascending index (hence the complement).
      const std::uint32_t index_key = std::numeric_limits<std::uint32_t>::max() - i;
      switch (preorder_) {
        case Preorder::kWidthAreaTotal:
          keyed.push_back({Key{lifetime, area, fullest, index_key}, i});
          break;
        case Preorder::kTotalAreaWidth:
          keyed.push_back({Key{fullest, area, lifetime, index_key}, i});
          break;
        case Preorder::kTotalWidthArea:
          keyed.push_back({Key{fullest, lifetime, area, index_key}, i});
          break;
      }
    }
    std::sort(keyed.begin(), keyed.end(),
              [](const auto& a, const auto& b) { return a.first > b.first; });
    for (std::uint32_t r = 0; r < keyed.size(); ++r) rank_[keyed[r].second] = r;
  }

  // The factor, in 1/1024ths, that order_seed gives buffer `input`'s keys: 1024 without a
  // seed, else 960 to 1088 (SearchSettings), from a splitmix64 hash of seed and buffer.
  std::uint64_t key_scale(std::size_t input) const {
    if (settings_.order_seed == 0) return 1024;
    std::uint64_t h = settings_.order_seed * 0x9E3779B97F4A7C15ULL + input;
    h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ULL;
    h = (h ^ (h >> 27)) * 0x94D049BB133111EBULL;
    h ^= h >> 31;
    return 960 + h % 129;
  }
  // key * scale / 1024, rounded down, saturating: (key / 1024) * scale + (key % 1024) *
  // scale / 1024, whose second term is below 2^21.
  static std::uint64_t scaled(std::uint64_t key, std::uint64_t scale) {
    const std::uint64_t high = saturating_mul(key >> 10, scale);
    const std::uint64_t low = ((key & 1023) * scale) >> 10;
    return high > std::numeric_limits<std::uint64_t>::max() - low
               ? std::numeric_limits<std::uint64_t>::max()
               : high + low;
  }

  bool out_of_time() {
    ++nodes_;
    if (settings_.max_nodes != 0 && nodes_ >= settings_.max_nodes) return true;
    if ((nodes_ & 255) != 0) return false;
    if (tick_) tick_(nodes_);
    if (settings_.cancel != nullptr && settings_.cancel->load(std::memory_order_relaxed)) {
      return true;
    }
    return std::chrono::steady_clock::now() >= settings_.deadline;
  }

  // Every plan below this node places the partition's buffers at (offset, rank) not below
  // (last, last_rank). The state is restored on return, whatever the outcome; a plan found
  // is in solution_.
  Outcome descend(const Partition& part, std::uint64_t last, std::uint32_t last_rank) {
    if (node_budget_ == 0) return Outcome::kOutOfNodes;
    --node_budget_;
    if (out_of_time()) return Outcome::kOutOfTime;
    // The unplaced buffers that may go next, by (lowest offset, rank): only those below
    // every unplaced buffer's top (dominance: one that could sit wholly below this offset
    // would leave a gap under it in any plan that continues from here) and not below the
    // last placement.
    std::uint64_t min_height = std::numeric_limits<std::uint64_t>::max();
    bool any_unplaced = false;
    for (const std::uint32_t i : part.members) {
      if (position_[i] != kUnplaced) continue;
      any_unplaced = true;
      min_height = std::min(min_height, saturating_add(min_offset_[i], items_[i].size));
    }
    if (!any_unplaced) return Outcome::kFound;
    // (offset, rank, buffer)
    std::vector<std::tuple<std::uint64_t, std::uint32_t, std::uint32_t>> candidates;
    for (const std::uint32_t i : part.members) {
      if (position_[i] != kUnplaced) continue;
      const std::uint64_t offset = min_offset_[i];
      if (offset >= min_height || offset < last || (offset == last && rank_[i] < last_rank)) {
        continue;
      }
      candidates.emplace_back(offset, rank_[i], i);
    }
    std::sort(candidates.begin(), candidates.end());
    for (const auto& candidate : candidates) {
      const std::uint64_t offset = std::get<0>(candidate);
      const std::uint32_t chosen = std::get<2>(candidate);
      bool hatless = false;
      const Outcome outcome = try_place(part, chosen, offset, hatless);
      if (outcome != Outcome::kInfeasible) return outcome;
      // A buffer no unplaced buffer shares time with ("hatless") constrains nothing:
      // placing another one first cannot do better.
      if (hatless) break;
    }
    return Outcome::kInfeasible;
  }

  Outcome try_place(const Partition& part, std::uint32_t chosen, std::uint64_t offset,
                    bool& hatless) {
    const Item& item = items_[chosen];
    const std::uint64_t top = saturating_add(offset, item.size);
    position_[chosen] = offset;
    solution_[chosen] = offset;
    take_out(chosen);
    const std::size_t offsets_saved = saved_offsets_.size();
    const std::size_t floors_saved = saved_floors_.size();
    // The sections whose floor may rise: those of the buffers raised, which all share time
    // with the chosen one, so together with its own they are one run of sections.
    std::uint32_t affected_begin = item.first_section;
    std::uint32_t affected_end = item.end_section;
    bool any_raised = false;
    hatless = true;
    for (const std::uint32_t c : item.conflicts) {
      if (position_[c] != kUnplaced) continue;
      hatless = false;
      const std::uint64_t raised = align_up_saturating(top, items_[c].alignment);
      if (min_offset_[c] >= raised) continue;
      saved_offsets_.emplace_back(c, min_offset_[c]);
      min_offset_[c] = raised;
      any_raised = true;
      affected_begin = std::min(affected_begin, items_[c].first_section);
      affected_end = std::max(affected_end, items_[c].end_section);
    }
    if (!any_raised) affected_end = affected_begin;
    for (std::uint32_t s = item.first_section; s < item.end_section; ++s) {
      saved_floors_.emplace_back(s, floor_[s]);
      floor_[s] = top;
      total_[s] -= item.size;
    }
    // Section inference: a section's floor is at least the lowest offset any of its
    // unplaced buffers can still take. The scan stops at the first one at or below
    // max(floor, capacity - unplaced bytes): the floor is then left as it is, which prunes
    // exactly what the lowest offset would, here and below (there the unplaced bytes only
    // shrink, and a rise of the lowest offset is a rise of some buffer's, which rescans).
    for (std::uint32_t s = affected_begin; s < affected_end; ++s) {
      const std::uint64_t room = total_[s] < capacity_ ? capacity_ - total_[s] : 0;
      const std::uint64_t enough = std::max(floor_[s], room);
      std::uint64_t lowest = std::numeric_limits<std::uint64_t>::max();
      for (const std::uint32_t m : unplaced_[s]) {
        lowest = std::min(lowest, min_offset_[m]);
        if (lowest <= enough) break;
      }
      if (lowest <= enough) continue;
      if (lowest != std::numeric_limits<std::uint64_t>::max() && floor_[s] < lowest) {
        saved_floors_.emplace_back(s, floor_[s]);
        floor_[s] = lowest;
      }
    }
    // Every later buffer of the partition goes at or above `offset`, so each section needs
    // max(offset, floor) + its unplaced bytes.
    bool feasible = true;
    for (std::uint32_t s = part.first_section; s < part.end_section; ++s) {
      if (saturating_add(std::max(offset, floor_[s]), total_[s]) > capacity_) {
        feasible = false;
        break;
      }
    }
    Outcome outcome = Outcome::kInfeasible;
    if (feasible) outcome = continue_after(part, chosen, offset);
    while (saved_floors_.size() > floors_saved) {
      floor_[saved_floors_.back().first] = saved_floors_.back().second;
      saved_floors_.pop_back();
    }
    for (std::uint32_t s = item.first_section; s < item.end_section; ++s) {
      total_[s] += item.size;
    }
    while (saved_offsets_.size() > offsets_saved) {
      min_offset_[saved_offsets_.back().first] = saved_offsets_.back().second;
      saved_offsets_.pop_back();
    }
    position_[chosen] = kUnplaced;
    put_back(chosen);
    return outcome;
  }

  // Dynamic decomposition: once the chosen buffer is placed, the time points it alone
  // spanned may cut the partition into independent parts, each searched on its own.
  Outcome continue_after(const Partition& part, std::uint32_t chosen, std::uint64_t offset) {
    const Item& item = items_[chosen];
    std::vector<std::uint32_t> cutpoints;
    for (std::uint32_t s = item.first_section; s + 1 < item.end_section; ++s) {
      if (--cuts_[s] == 0) cutpoints.push_back(s + 1);
    }
    Outcome outcome = Outcome::kFound;
    if (cutpoints.empty()) {
      outcome = descend(part, offset, rank_[chosen]);
    } else {
      cutpoints.insert(cutpoints.begin(), part.first_section);
      cutpoints.push_back(part.end_section);
      for (std::size_t k = 0; k + 1 < cutpoints.size(); ++k) {
        Partition sub{
            .members = {}, .first_section = cutpoints[k], .end_section = cutpoints[k + 1]};
        for (const std::uint32_t m : part.members) {
          if (position_[m] != kUnplaced) continue;
          if (items_[m].end_section <= sub.first_section ||
              sub.end_section <= items_[m].first_section) {
            continue;
          }
          sub.members.push_back(m);
        }
        if (sub.members.empty()) continue;
        std::vector<std::uint32_t> saved_ranks;
        saved_ranks.reserve(sub.members.size());
        for (const std::uint32_t m : sub.members) saved_ranks.push_back(rank_[m]);
        rank_partition(sub);
        outcome = descend(sub, 0, 0);
        for (std::size_t j = 0; j < sub.members.size(); ++j) rank_[sub.members[j]] = saved_ranks[j];
        if (outcome != Outcome::kFound) break;
      }
    }
    for (std::uint32_t s = item.first_section; s + 1 < item.end_section; ++s) ++cuts_[s];
    return outcome;
  }

  const std::vector<Item>& items_;
  std::uint64_t capacity_;
  const SearchSettings& settings_;
  const std::function<void(std::uint64_t)>& tick_;
  std::uint64_t& nodes_;
  std::uint64_t node_budget_ = 0;
  // Per section: the unplaced buffers crossing it, in no order; slot_ holds each buffer's
  // place in the lists of its sections (from slot_base_), so that placing and unplacing
  // are swaps, undone in reverse.
  std::vector<std::vector<std::uint32_t>> unplaced_;
  std::vector<std::size_t> slot_base_;
  std::vector<std::uint32_t> slot_;
  std::vector<std::uint64_t> floor_;       // per section: lowest offset still free
  std::vector<std::uint64_t> total_;       // per section: bytes of unplaced buffers
  std::vector<std::uint32_t> cuts_;        // per section: unplaced buffers crossing its end
  std::vector<std::uint64_t> min_offset_;  // per buffer: lowest offset it can still take
  std::vector<std::uint64_t> position_;    // per buffer: placed offset, or kUnplaced
  std::vector<std::uint64_t> solution_;    // per buffer: offset in the plan found
  std::vector<std::uint32_t> rank_;        // per buffer: place in the static order
  Preorder preorder_ = Preorder::kWidthAreaTotal;
  std::vector<std::pair<std::uint32_t, std::uint64_t>> saved_offsets_;  // undo logs
  std::vector<std::pair<std::uint32_t, std::uint64_t>> saved_floors_;
};

// Tries the static orders in turn with a node budget that doubles each round, so an order
// that suits the instance finishes early (MiniMalloc's round robin).
SearchOutcome search_component(const std::vector<Item>& items, std::uint32_t sections,
                               std::uint64_t capacity, const SearchSettings& settings,
                               const std::function<void(std::uint64_t)>& tick, std::uint64_t& nodes,
                               std::vector<std::uint64_t>& positions) {
  std::uint64_t budget = std::max<std::uint64_t>(items.size(), 16);
  while (true) {
    budget *= 2;
    for (const Preorder preorder : kPreorders) {
      ComponentSearch search(items, sections, capacity, settings, tick, nodes);
      const Outcome outcome = search.run(preorder, budget);
      if (outcome == Outcome::kFound) {
        positions = search.positions();
        return SearchOutcome::kFound;
      }
      if (outcome == Outcome::kInfeasible) return SearchOutcome::kInfeasible;
      if (outcome == Outcome::kOutOfTime) return SearchOutcome::kTimedOut;
    }
  }
}

// search_within on the caller's stack; search_within runs it on a deep one (deep_stack.hpp).
SearchResult search_on_this_stack(std::span<const Buffer> buffers, std::uint64_t capacity,
                                  const SearchSettings& settings,
                                  const std::function<void(std::uint64_t)>& tick) {
  SearchResult result;
  result.plan.offsets.assign(buffers.size(), 0);
  // Buffers by start; a new component begins where no earlier buffer is still live.
  std::vector<std::size_t> by_start(buffers.size());
  std::iota(by_start.begin(), by_start.end(), std::size_t{0});
  std::sort(by_start.begin(), by_start.end(),
            [&](std::size_t a, std::size_t b) { return buffers[a].lower < buffers[b].lower; });
  std::size_t begin = 0;
  while (begin < by_start.size()) {
    std::int64_t reach = buffers[by_start[begin]].upper;
    std::size_t end = begin + 1;
    while (end < by_start.size() && buffers[by_start[end]].lower < reach) {
      reach = std::max(reach, buffers[by_start[end]].upper);
      ++end;
    }
    // Sections of this component.
    std::vector<std::int64_t> times;
    for (std::size_t k = begin; k < end; ++k) {
      times.push_back(buffers[by_start[k]].lower);
      times.push_back(buffers[by_start[k]].upper);
    }
    std::sort(times.begin(), times.end());
    times.erase(std::unique(times.begin(), times.end()), times.end());
    const auto section_of = [&](std::int64_t t) {
      return static_cast<std::uint32_t>(std::lower_bound(times.begin(), times.end(), t) -
                                        times.begin());
    };
    std::vector<Item> items;
    for (std::size_t k = begin; k < end; ++k) {
      const Buffer& b = buffers[by_start[k]];
      items.push_back(Item{.input = by_start[k],
                           .size = b.size,
                           .alignment = b.alignment,
                           .lifetime = lifetime_of(b.lower, b.upper),
                           .first_section = section_of(b.lower),
                           .end_section = section_of(b.upper),
                           .conflicts = {}});
    }
    // Conflicts: sweep in start order (items are sorted by lower).
    for (std::uint32_t i = 0; i < items.size(); ++i) {
      for (std::uint32_t j = i + 1; j < items.size(); ++j) {
        if (items[j].first_section >= items[i].end_section) break;
        items[i].conflicts.push_back(j);
        items[j].conflicts.push_back(i);
      }
    }
    std::vector<std::uint64_t> positions;
    result.outcome = search_component(items, static_cast<std::uint32_t>(times.size()), capacity,
                                      settings, tick, result.nodes, positions);
    if (result.outcome != SearchOutcome::kFound) return result;
    for (std::size_t i = 0; i < items.size(); ++i) {
      const std::size_t input = items[i].input;
      result.plan.offsets[input] = positions[i];
      result.plan.arena_size = std::max(result.plan.arena_size, positions[i] + buffers[input].size);
    }
    begin = end;
  }
  result.outcome = SearchOutcome::kFound;
  return result;
}

}  // namespace

SearchResult search_within(std::span<const Buffer> buffers, std::uint64_t capacity,
                           const SearchSettings& settings,
                           const std::function<void(std::uint64_t)>& tick) {
  // The recursion is as deep as a component has buffers; a few hundred levels fit any
  // thread's stack (a few KiB a level under AddressSanitizer), and a thread of its own
  // would cost more than such a search (the fuzzers plan thousands of them a second).
  if (buffers.size() <= kBuffersOnCallersStack) {
    return search_on_this_stack(buffers, capacity, settings, tick);
  }
  SearchResult result;
  run_on_deep_stack([&] { result = search_on_this_stack(buffers, capacity, settings, tick); });
  return result;
}

}  // namespace sdalloc::planner_detail
