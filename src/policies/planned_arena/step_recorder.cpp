// policies/planned_arena/step_recorder.cpp - recording a step's events, and planning them.
#include "policies/planned_arena/step_recorder.hpp"

#include <algorithm>

namespace sdalloc::planned_arena_detail {

void StepRecorder::start() {
  started_ = std::chrono::steady_clock::now();
  recording_ = true;
  gave_up_ = false;
  slots_.clear();
  events_.clear();
  live_.clear();
}

void StepRecorder::abandon() {
  recording_ = false;
  slots_.clear();
  events_.clear();
  live_.clear();
}

void StepRecorder::record_allocation(void* p, std::size_t rounded, std::size_t alignment) {
  const auto k = static_cast<std::uint32_t>(slots_.size());
  Slot slot;
  slot.rounded = rounded;
  slot.alignment = alignment;
  slot.allocated_at = static_cast<std::int64_t>(events_.size());
  slots_.push_back(slot);
  events_.push_back(Event{true, k});
  live_.emplace(p, k);
}

void StepRecorder::record_free(void* p) {
  const auto it = live_.find(p);
  if (it == live_.end()) return;
  slots_[it->second].freed_at = static_cast<std::int64_t>(events_.size());
  events_.push_back(Event{false, it->second});
  live_.erase(it);
}

double StepRecorder::seconds_recorded() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
}

std::shared_ptr<StepPlan> StepRecorder::finish(double planner_time_limit_seconds,
                                               std::uint64_t planner_max_search_nodes) {
  PlannerOptions planner_options;
  planner_options.time_limit_seconds = planner_time_limit_seconds;
  planner_options.max_search_nodes = planner_max_search_nodes;
  return finish(planner_options);
}

std::shared_ptr<StepPlan> StepRecorder::finish(const PlannerOptions& planner_options) {
  recording_ = false;  // first: should planning throw, the step is no longer recorded
  gave_up_ = false;
  live_.clear();
  // Kept slots are not planned: later steps take them from the fallback pool.
  auto planned = std::make_shared<StepPlan>();
  std::vector<Buffer> buffers;
  std::vector<std::size_t> planned_slots;
  for (std::size_t k = 0; k < slots_.size(); ++k) {
    Slot& s = slots_[k];
    s.kept = s.freed_at < 0;
    if (s.kept) continue;
    buffers.push_back(Buffer{.id = k,
                             .lower = s.allocated_at,
                             .upper = s.freed_at,
                             .size = s.rounded,
                             .alignment = s.alignment});
    planned_slots.push_back(k);
    planned->alignment = std::max(planned->alignment, s.alignment);
  }
  if (buffers.empty()) return nullptr;  // nothing for an arena
  const PlanResult result = plan(buffers, planner_options);
  if (result.cut_short) {
    gave_up_ = true;
    slots_.clear();
    events_.clear();
    return nullptr;
  }
  planned->size = static_cast<std::size_t>(result.plan.arena_size);
  for (std::size_t i = 0; i < planned_slots.size(); ++i) {
    slots_[planned_slots[i]].offset = static_cast<std::size_t>(result.plan.offsets[i]);
    planned->offsets.push_back(slots_[planned_slots[i]].offset);
  }
  std::vector<std::size_t>& offsets = planned->offsets;
  std::sort(offsets.begin(), offsets.end());
  offsets.erase(std::unique(offsets.begin(), offsets.end()), offsets.end());
  for (Slot& s : slots_) {
    s.offset_index = static_cast<std::size_t>(
        std::lower_bound(offsets.begin(), offsets.end(), s.offset) - offsets.begin());
  }
  planned->slots = std::move(slots_);
  planned->events = std::move(events_);
  slots_.clear();
  events_.clear();
  return planned;
}

}  // namespace sdalloc::planned_arena_detail
