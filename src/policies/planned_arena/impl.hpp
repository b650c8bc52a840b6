// policies/planned_arena/impl.hpp - PlannedArena::Impl: the state behind a PlannedArena
// and the steps of its work, declared for the files that define them: planned_arena.cpp
// (allocation routing, steps, figures, the public API) and free_routing.cpp (frees and
// sizes: where a pointer lives).
//
// Invariants (under `mutex`):
//  - in_step: choosing, recorder.recording(), `active` and `divergent` describe the step;
//    outside a step none is set. At most one of choosing and recorder.recording() holds.
//  - active != nullptr only in a planned step; while !divergent, the arena's live buffers
//    are exactly those the recording had live at event `cursor`, so no slot is handed out
//    while its previous occupant is live. A divergent step hands out no arena memory.
//  - Plans exist only with a current arena (SharedArena retires it with the last plan).
//  - Members are destroyed in reverse order: recording blocks, then arenas, then the pool.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "policies/planned_arena/arena.hpp"
#include "policies/planned_arena/figures.hpp"
#include "policies/planned_arena/plan_set.hpp"
#include "policies/planned_arena/recording_blocks.hpp"
#include "policies/planned_arena/step_plan.hpp"
#include "policies/planned_arena/step_recorder.hpp"
#include "policies/planned_arena/stream_users.hpp"
#include "sdalloc/core/stream_events.hpp"
#include "sdalloc/policies/any_pool.hpp"
#include "sdalloc/policies/planned_arena.hpp"
#include "sdalloc/resources/stats_resource.hpp"

namespace sdalloc {

struct PlannedArena::Impl {
  using Arena = planned_arena_detail::Arena;
  using PlanSet = planned_arena_detail::PlanSet;
  using RecordingBlocks = planned_arena_detail::RecordingBlocks;
  using SharedArena = planned_arena_detail::SharedArena;
  using StepPlan = planned_arena_detail::StepPlan;
  using StepRecorder = planned_arena_detail::StepRecorder;
  using StreamUsers = planned_arena_detail::StreamUsers;

  Impl(MemoryResource& up, PlannedArenaOptions opts, const FallbackMaker& make_fallback)
      : upstream(up),
        held(up),
        options(validated(opts)),
        pool_owner(make_fallback(held, options.fallback)),
        pool(*pool_owner),
        events(options.fallback.stream_events != nullptr ? *options.fallback.stream_events
                                                         : HostStreamEvents::instance()),
        plan_stream_handle(options.plan_stream.handle),
        plans(options.max_plans, options.replan_after_divergent_steps),
        arenas(held, pool, events, options.prefault_host_arena, options.arena_from_fallback),
        recording_blocks(held) {}

  static PlannedArenaOptions validated(PlannedArenaOptions opts);

  MemoryResource& upstream;
  // Everything the three sources (the fallback pool, the arenas, the recording's blocks)
  // hold from the upstream passes through here: its peak is the arena's reserved peak. The
  // sum of the sources' own peaks is only a bound, and a loose one: arenas of two shapes
  // that are never held at once would count twice (docs/pytorch.md has a measured case).
  StatsResource held;
  const PlannedArenaOptions options;
  std::unique_ptr<AnyPool> pool_owner;  // the fallback pool
  AnyPool& pool;
  StreamEvents& events;

  // The stream whose sequence is planned: set by begin_step(stream) when a step is recorded.
  // Written under `mutex`; read without it to send other streams to the pool at once.
  std::atomic<std::uintptr_t> plan_stream_handle;
  Stream plan_stream() const { return Stream(plan_stream_handle.load(std::memory_order_relaxed)); }

  mutable std::mutex mutex;
  PlanSet plans;
  SharedArena arenas;                // declared after `pool`: released before it
  RecordingBlocks recording_blocks;  // declared after `arenas`: released before them
  StepRecorder recorder;
  StreamUsers users;

  // The step in progress.
  bool in_step = false;
  bool choosing = false;             // plans exist; the step's first allocation picks one
  bool divergent = false;            // the step left its plan (or matched none)
  std::shared_ptr<StepPlan> active;  // the plan the step follows
  std::size_t cursor = 0;            // next event of the plan the step must match

  PlannedArenaCounters counters;
  planned_arena_detail::LiveGauge live;  // what the three sources have live at once
  // Events of the shortest recording the planner ran out of time on (0: none yet). A later
  // recording that grows as long is given up there, so end_step() is not kept waiting
  // for a plan it will not get, step after step.
  std::size_t unplannable_events = 0;

  // The recording's plan-stream allocations are blocks of the upstream (RecordingBlocks);
  // otherwise the fallback pool serves them.
  bool record_upstream() const;
  bool recording_step() const { return in_step && recorder.recording(); }
  bool planned_step_active() const { return in_step && !recorder.recording() && active != nullptr; }

  // The rest of the step goes to the fallback pool; what it recorded stays live where it is.
  void give_up_recording();
  void diverge();
  void check_size(std::optional<std::size_t> bytes, std::size_t requested) const;
  std::string name() const { return "planned(" + upstream.name() + ")"; }

  // ---- allocation routing ---------------------------------------------------------------

  void* allocate(std::size_t bytes, std::size_t alignment, Stream stream);
  void* route_allocation(std::size_t bytes, std::size_t alignment, Stream stream);

  // A request on a stream other than the plan stream: the fallback pool, not recorded.
  void* allocate_elsewhere(std::size_t bytes, std::size_t alignment, Stream stream);

  // The step's first plan-stream allocation picks the most recently followed plan that
  // begins with it; with none, the step is recorded as a new plan while there is room, and
  // otherwise served by the fallback pool (divergent).
  void choose_plan(std::size_t rounded, std::size_t alignment);

  // A recording through the upstream needs neither what the fallback pool caches nor an
  // arena with nothing live in it, and held both beside it: a new shape recorded after
  // warm-ups outside any step held more than twice what PyTorch's allocator held (figures in
  // docs/pytorch.md). Both go back first; the arena is reserved again at the next
  // planned step. An arena taken from the fallback pool goes back to the pool, whose pages
  // then serve the recording (the pool keeps them: no call to the memory).
  void start_recording();

  // The request is the plan's next event: its slot's address (or, for a kept slot, a
  // fallback-pool block). nullptr when it is not, and the step diverges.
  void* try_planned(std::size_t bytes, std::size_t rounded, std::size_t alignment);

  // ---- free routing ---------------------------------------------------------------------

  // `bytes` is the caller's byte count, checked against the allocation; nullopt: not known
  // (the size-less free of the C API and PyTorch's shim).
  void deallocate(void* ptr, std::optional<std::size_t> bytes, Stream stream);

  // Frees ptr where it lives; answers the bytes it was asked for.
  std::size_t route_free(void* ptr, std::optional<std::size_t> bytes, Stream stream);
  std::size_t pool_free(void* ptr, std::optional<std::size_t> bytes, Stream stream);
  std::size_t free_in_arena(Arena& arena, bool is_current, std::uintptr_t addr,
                            std::optional<std::size_t> bytes, Stream stream);

  // The bytes it was asked for; nullopt when ptr is not a live recording block.
  std::optional<std::size_t> free_recording_block(void* ptr, std::optional<std::size_t> bytes);

  // ---- other streams and sizes ----------------------------------------------------------

  void record_stream(void* ptr, Stream stream);

  // Under the lock: the bytes asked for by ptr when it is a live arena buffer or a live
  // recording block.
  std::optional<std::size_t> requested_size_here(const void* ptr) const;
  std::size_t allocation_size(const void* ptr) const;

  // ---- steps ----------------------------------------------------------------------------

  void begin_step(Stream stream);
  void end_step();

  // The arena, released by a trim or for a recording, reserved again; when that is refused
  // (counted), every plan goes.
  void reserve_arena_again();

  // Adds the recording's plan, growing the shared arena if it needs more; a plan whose
  // arena is refused is dropped (counted in arena_failures).
  void add_plan(std::shared_ptr<StepPlan> planned);

  // ---- memory given back, layout and figures --------------------------------------------

  // What the fallback pool caches, and the arena when no step is in progress and none of its
  // memory is live (the plan stays: the next begin_step reserves the arena again). Lets a
  // pipeline give one stage's arena back before its next stage the way
  // torch.cuda.empty_cache() gives back a cache.
  std::size_t trim();
  PoolLayout layout() const;
  PoolStats stats() const;
  void reset_peak();
  PlannedArenaCounters current_counters() const;
};

}  // namespace sdalloc
