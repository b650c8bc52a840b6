// policies/planned_arena/step_recorder.hpp - what a recording step captures, and its plan.
//
// While a step is recorded, every plan-stream allocation becomes a slot (its size rounded to
// kRounding and its alignment: what a later step must repeat) and every free of a recorded
// pointer an event, in order. finish() plans the recording with sdalloc::plan() and hands
// it over as a StepPlan. Where the recorded memory came from (the upstream, see
// RecordingBlocks, or the fallback pool) is not the recorder's concern.
//
// Invariants: recording() from start() to finish(); live_ maps each pointer a recorded
// allocation handed out and no recorded free has given back to its slot; a slot's
// allocated_at and freed_at index events_. Not thread-safe: PlannedArena's mutex guards it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "policies/planned_arena/step_plan.hpp"

namespace sdalloc::planned_arena_detail {

class StepRecorder {
 public:
  // Forgets any earlier recording and starts a new one.
  void start();
  bool recording() const { return recording_; }

  // A plan-stream allocation of the step: `p` was handed out for (rounded, alignment).
  void record_allocation(void* p, std::size_t rounded, std::size_t alignment);
  // The free of `p`; pointers the recording did not hand out are not events of it.
  void record_free(void* p);

  // Ends the recording and plans it (within planner_time_limit_seconds and, unless 0,
  // planner_max_search_nodes: PlannerOptions::max_search_nodes). Slots still live
  // become kept. nullptr when no slot is left for the arena, or when the planner ran out of
  // time before its first greedy plan was complete (gave_up() then says so: such a plan
  // would stack most buffers one over another). Such a step records again.
  std::shared_ptr<StepPlan> finish(double planner_time_limit_seconds,
                                   std::uint64_t planner_max_search_nodes = 0);
  bool gave_up() const { return gave_up_; }
  // Ends the recording without planning it.
  void abandon();
  // Allocations and frees recorded so far.
  std::size_t event_count() const { return events_.size(); }

 private:
  bool recording_ = false;
  bool gave_up_ = false;  // the last finish() ran out of planning time
  std::vector<Slot> slots_;
  std::vector<Event> events_;
  std::unordered_map<void*, std::uint32_t> live_;  // recorded pointer -> slot
};

}  // namespace sdalloc::planned_arena_detail
