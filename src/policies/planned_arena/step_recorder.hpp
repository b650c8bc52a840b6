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

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "policies/planned_arena/step_plan.hpp"
#include "sdalloc/planner/planner.hpp"
#include "sdalloc/policies/planned_arena.hpp"

namespace sdalloc::planned_arena_detail {

// The planner's options for a recording that ran `seconds_recorded`: the time and node
// limits of `options`, plan_within as accept_within, and a search that takes at most
// planner_share_of_step of the recording's duration (none of it under a node limit, which
// is there for the same plan on every machine). Defined in options.cpp.
PlannerOptions planner_options_of(const PlannedArenaOptions& options, double seconds_recorded);

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
  // The same with the planner's options as they are (capacity and progress are not used).
  std::shared_ptr<StepPlan> finish(const PlannerOptions& planner_options);
  // Seconds since start(): how long the step being recorded has run.
  double seconds_recorded() const;
  bool gave_up() const { return gave_up_; }
  // Ends the recording without planning it.
  void abandon();
  // Allocations and frees recorded so far.
  std::size_t event_count() const { return events_.size(); }

 private:
  std::chrono::steady_clock::time_point started_;
  bool recording_ = false;
  bool gave_up_ = false;  // the last finish() ran out of planning time
  std::vector<Slot> slots_;
  std::vector<Event> events_;
  std::unordered_map<void*, std::uint32_t> live_;  // recorded pointer -> slot
};

}  // namespace sdalloc::planned_arena_detail
