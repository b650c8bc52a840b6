// policies/planned_arena/step_plan.hpp - one recorded step, planned: the sequence of
// allocations and frees a later step must repeat, and each allocation's place in the arena.
//
// Invariants of a StepPlan (made by StepRecorder::finish, then only read, except the two
// bookkeeping fields at the end):
//  - slots[k] is the step's k-th plan-stream allocation; events holds, in order, one
//    allocation event per slot and at most one free event per slot, after its allocation.
//  - A slot without a free is kept: a loop's carried state, served in later steps by the
//    fallback pool, never by the arena. Every other slot is planned at `offset`, and buffers
//    whose lifetimes [allocated_at, freed_at) intersect get disjoint bytes.
//  - offsets are the distinct offsets of the planned slots, sorted; offset_index indexes it.
//  - size >= offset + rounded of every planned slot; alignment divides every planned offset.
// Internal to PlannedArena; like every piece of it, guarded by PlannedArena's mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "sdalloc/policies/caching_pool.hpp"

namespace sdalloc::planned_arena_detail {

// Sizes are matched after this rounding (the fallback pool's), so a step may repeat a
// request with a few bytes more or less and still follow its plan.
inline constexpr std::size_t kRounding = CachingPool::kRounding;

// One allocation of the recorded step; slot k is the k-th allocation.
struct Slot {
  std::size_t rounded = 0;        // size after rounding to kRounding: what must match
  std::size_t alignment = 0;      // max(requested alignment, kRounding): must match too
  std::int64_t allocated_at = 0;  // event index of the allocation
  std::int64_t freed_at = -1;     // event index of the free, -1 while live
  std::size_t offset = 0;         // in the arena, once planned
  std::size_t offset_index = 0;   // index into StepPlan::offsets
  // Live at the end of the recorded step (a loop's carried state, e.g. the next latents):
  // later steps take it from the fallback pool, so no arena memory outlives its step.
  bool kept = false;
};

// The recorded sequence: an allocation of slot k, or the free of slot k.
struct Event {
  bool is_alloc;
  std::uint32_t slot;
};

struct StepPlan {
  std::vector<Slot> slots;
  std::vector<Event> events;
  std::vector<std::size_t> offsets;   // distinct planned offsets, sorted
  std::size_t size = 0;               // bytes it needs from the arena's base
  std::size_t alignment = kRounding;  // its strictest planned alignment
  // Kept by PlanSet: divergent steps in a row that picked this plan, and when a step last
  // followed it (the least recent is dropped first).
  std::size_t divergent_in_a_row = 0;
  std::uint64_t last_used = 0;
};

}  // namespace sdalloc::planned_arena_detail
