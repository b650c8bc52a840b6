// policies/planned_arena/planned_arena.cpp - PlannedArena: routes each request to the arena,
// the recording or the fallback pool, and moves the step through its plan.
//
// The pieces (this folder): StepRecorder (what a recorded step captures, and its plan),
// PlanSet (the plans, and which one a step follows), SharedArena (the arena's lifetime and
// occupancy), RecordingBlocks (a recording's blocks straight from the upstream),
// StreamUsers (record_stream), figures (stats), options (their checks). This file holds
// the step: begin_step picks how it is served, each plan-stream allocation and arena free is
// matched against the next event of the plan (`cursor`), and the first mismatch makes the
// step divergent: from then on the fallback pool serves it. See planned_arena.hpp for the contract.
//
// Invariants (under `mutex`):
//  - in_step: choosing, recorder.recording(), `active` and `divergent` describe the step;
//    outside a step none is set. At most one of choosing and recorder.recording() holds.
//  - active != nullptr only in a planned step; while !divergent, the arena's live buffers
//    are exactly those the recording had live at event `cursor`, so no slot is handed out
//    while its previous occupant is live. A divergent step hands out no arena memory.
//  - Plans exist only with a current arena (SharedArena retires it with the last plan).
//  - Members are destroyed in reverse order: recording blocks, then arenas, then the pool.
#include "sdalloc/policies/planned_arena.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/bits.hpp"
#include "policies/planned_arena/arena.hpp"
#include "policies/planned_arena/figures.hpp"
#include "policies/planned_arena/plan_set.hpp"
#include "policies/planned_arena/recording_blocks.hpp"
#include "policies/planned_arena/step_plan.hpp"
#include "policies/planned_arena/step_recorder.hpp"
#include "policies/planned_arena/stream_users.hpp"
#include "sdalloc/core/errors.hpp"
#include "sdalloc/core/stream_events.hpp"
#include "sdalloc/policies/any_pool.hpp"
#include "sdalloc/resources/stats_resource.hpp"

namespace sdalloc {

using planned_arena_detail::Arena;
using planned_arena_detail::combine_stats;
using planned_arena_detail::Event;
using planned_arena_detail::kRounding;
using planned_arena_detail::planner_options_of;
using planned_arena_detail::PlanSet;
using planned_arena_detail::RecordingBlocks;
using planned_arena_detail::SharedArena;
using planned_arena_detail::Slot;
using planned_arena_detail::StepPlan;
using planned_arena_detail::StepRecorder;
using planned_arena_detail::StreamUsers;

struct PlannedArena::Impl {
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

  static PlannedArenaOptions validated(PlannedArenaOptions opts) {
    opts.validate();
    return opts;
  }

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
  bool record_upstream() const {
    return options.record_through_upstream && !options.arena_from_fallback;
  }
  bool recording_step() const { return in_step && recorder.recording(); }
  bool planned_step_active() const { return in_step && !recorder.recording() && active != nullptr; }

  // The rest of the step goes to the fallback pool; what it recorded stays live where it is.
  void give_up_recording() {
    recorder.abandon();
    recording_blocks.release_cache();
    ++counters.recorded_steps;
    ++counters.unplanned_steps;
  }

  void diverge() {
    if (!divergent) {
      divergent = true;
      ++counters.divergent_steps;
    }
  }

  void check_size(std::optional<std::size_t> bytes, std::size_t requested) const {
    if (bytes && *bytes != requested) {
      throw InvalidArgument(name() + ": free of " + std::to_string(*bytes) +
                            " bytes, but the allocation was " + std::to_string(requested) +
                            " bytes");
    }
  }

  std::string name() const { return "planned(" + upstream.name() + ")"; }

  // ---- allocation routing ---------------------------------------------------------------

  void* allocate(std::size_t bytes, std::size_t alignment, Stream stream) {
    void* p = route_allocation(bytes, alignment, stream);
    if (p != nullptr) live.add(bytes, round_up(bytes, kRounding));
    return p;
  }

  void* route_allocation(std::size_t bytes, std::size_t alignment, Stream stream) {
    if (!(stream == plan_stream())) return allocate_elsewhere(bytes, alignment, stream);
    const bool valid =
        is_power_of_two(alignment) && alignment <= kPoolMaxAlignment && bytes <= kPoolMaxAllocation;
    if (!valid || bytes == 0) return pool.allocate(bytes, alignment, stream);  // throws or null

    std::unique_lock<std::mutex> lock(mutex);
    if (!(stream == plan_stream())) {  // a begin_step on another thread moved the plan
      lock.unlock();
      return allocate_elsewhere(bytes, alignment, stream);
    }
    const std::size_t rounded = round_up(bytes, kRounding);
    const std::size_t effective_alignment = std::max(alignment, kRounding);
    if (in_step && choosing) choose_plan(rounded, effective_alignment);
    if (recording_step() && unplannable_events != 0 &&
        recorder.event_count() >= unplannable_events) {
      give_up_recording();
    }
    if (planned_step_active() && !divergent) {
      if (void* p = try_planned(bytes, rounded, effective_alignment)) return p;
      diverge();
    }
    if (recording_step() && record_upstream()) {
      void* p = recording_blocks.allocate(bytes, rounded, effective_alignment, plan_stream());
      ++counters.recorded_allocations;
      recorder.record_allocation(p, rounded, effective_alignment);
      return p;
    }
    void* p = pool.allocate(bytes, alignment, stream);
    if (recording_step()) {  // the pool serves the recording: not a fallback
      ++counters.recorded_allocations;
      recorder.record_allocation(p, rounded, effective_alignment);
    } else {
      ++counters.fallback_allocations;
    }
    return p;
  }

  // A request on a stream other than the plan stream: the fallback pool, not recorded.
  void* allocate_elsewhere(std::size_t bytes, std::size_t alignment, Stream stream) {
    void* p = pool.allocate(bytes, alignment, stream);
    if (p != nullptr) {
      std::lock_guard<std::mutex> lock(mutex);
      ++counters.fallback_allocations;
    }
    return p;
  }

  // The step's first plan-stream allocation picks the most recently followed plan that
  // begins with it; with none, the step is recorded as a new plan while there is room, and
  // otherwise served by the fallback pool (divergent).
  void choose_plan(std::size_t rounded, std::size_t alignment) {
    choosing = false;
    if (std::shared_ptr<StepPlan> best = plans.match_first_allocation(rounded, alignment)) {
      active = std::move(best);
      arenas.current()->occupy(active);
      ++counters.planned_steps;
      return;
    }
    if (!plans.full()) {
      start_recording();
      return;
    }
    ++counters.planned_steps;
    diverge();
  }

  // A recording through the upstream needs neither what the fallback pool caches nor an
  // arena with nothing live in it, and held both beside it: a new shape recorded after
  // warm-ups outside any step held more than twice what PyTorch's allocator held (figures in
  // docs/pytorch.md). Both go back first; the arena is reserved again at the next
  // planned step. An arena taken from the fallback pool goes back to the pool, whose pages
  // then serve the recording (the pool keeps them: no call to the memory).
  void start_recording() {
    if (record_upstream()) {
      pool.trim();
      arenas.trim();
    } else if (options.arena_from_fallback) {
      arenas.trim();
    }
    recorder.start();
  }

  // The request is the plan's next event: its slot's address (or, for a kept slot, a
  // fallback-pool block). nullptr when it is not, and the step diverges.
  void* try_planned(std::size_t bytes, std::size_t rounded, std::size_t alignment) {
    const std::vector<Event>& events_of_plan = active->events;
    if (cursor >= events_of_plan.size() || !events_of_plan[cursor].is_alloc) return nullptr;
    const std::uint32_t k = events_of_plan[cursor].slot;
    const Slot& slot = active->slots[k];
    if (slot.rounded != rounded || slot.alignment != alignment) return nullptr;
    if (slot.kept) {
      // Kept past the step in the recording: not arena memory, so the next step can begin
      // with the arena empty. Its free is not an event of the plan.
      void* p = pool.allocate(bytes, alignment, plan_stream());
      ++cursor;
      ++counters.kept_allocations;
      return p;
    }
    void* p = arenas.place(k, bytes);
    if (p == nullptr) return nullptr;
    ++cursor;
    ++counters.planned_allocations;
    return p;
  }

  // ---- free routing ---------------------------------------------------------------------

  // `bytes` is the caller's byte count, checked against the allocation; nullopt: not known
  // (the size-less free of the C API and PyTorch's shim).
  void deallocate(void* ptr, std::optional<std::size_t> bytes, Stream stream) {
    if (ptr == nullptr) return;
    const std::size_t freed = route_free(ptr, bytes, stream);
    live.sub(freed, round_up(freed, kRounding));
  }

  // Frees ptr where it lives; answers the bytes it was asked for.
  std::size_t route_free(void* ptr, std::optional<std::size_t> bytes, Stream stream) {
    std::unique_lock<std::mutex> lock(mutex);
    const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
    bool is_current = false;
    if (Arena* arena = arenas.find(addr, &is_current)) {
      return free_in_arena(*arena, is_current, addr, bytes, stream);
    }
    const std::optional<std::size_t> direct = free_recording_block(ptr, bytes);
    if (!direct && !recording_step()) {
      lock.unlock();
      return pool_free(ptr, bytes, stream);  // checks the pointer and the size
    }
    const std::size_t freed = direct ? *direct : pool_free(ptr, bytes, stream);
    if (recording_step()) recorder.record_free(ptr);
    return freed;
  }

  std::size_t pool_free(void* ptr, std::optional<std::size_t> bytes, Stream stream) {
    if (bytes) {
      pool.deallocate(ptr, *bytes, stream);
      return *bytes;
    }
    std::size_t size = 0;
    try {
      size = pool.allocation_size(ptr);
    } catch (const InvalidPointer&) {
      pool.free(ptr, stream);  // throws the pool's own words for a bad free
      throw;
    }
    pool.free(ptr, stream);
    return size;
  }

  std::size_t free_in_arena(Arena& arena, bool is_current, std::uintptr_t addr,
                            std::optional<std::size_t> bytes, Stream stream) {
    std::size_t index = 0;
    const std::int64_t slot = arena.live_slot_at(addr, &index);
    if (slot < 0) {
      throw InvalidPointer(name() + ": free of a pointer that is not a live allocation (" +
                               "freed already, or inside a planned buffer)",
                           reinterpret_cast<const void*>(addr));
    }
    const auto k = static_cast<std::size_t>(slot);
    check_size(bytes, arena.requested(k));
    std::vector<StreamEvents::Event> waits;
    const bool named_elsewhere = users.record_events(reinterpret_cast<void*>(addr), events, waits);
    // Diverges whether or not an event was needed (host streams have none), so a step
    // behaves the same on every backend.
    const bool used_elsewhere = named_elsewhere || !(stream == arena.stream());
    if (!(stream == arena.stream())) {  // freed for reuse on another stream than the arena's
      if (const StreamEvents::Event e = events.record(stream); e != StreamEvents::kNoEvent) {
        waits.push_back(e);
      }
    }
    arenas.add_users(waits);
    if (is_current && planned_step_active() && !divergent) {
      // A slot is reused within its step at once; memory another stream still uses cannot
      // be, so such a free ends the plan for this step.
      const std::vector<Event>& events_of_plan = active->events;
      const bool expected = !used_elsewhere && cursor < events_of_plan.size() &&
                            !events_of_plan[cursor].is_alloc && events_of_plan[cursor].slot == k;
      if (expected) {
        ++cursor;
      } else {
        diverge();
      }
    }
    const std::size_t requested = arena.requested(k);
    arenas.vacate(arena, index, k);
    return requested;
  }

  // The bytes it was asked for; nullopt when ptr is not a live recording block.
  std::optional<std::size_t> free_recording_block(void* ptr, std::optional<std::size_t> bytes) {
    const std::optional<std::size_t> requested = recording_blocks.requested_size(ptr);
    if (!requested) return std::nullopt;
    check_size(bytes, *requested);
    // Another stream may still use it: its block is neither cached nor released before that
    // work is done. Rare (record_stream during a recorded step), so the free simply waits.
    std::vector<StreamEvents::Event> waits;
    users.record_events(ptr, events, waits);
    for (const StreamEvents::Event e : waits) {
      events.synchronize(e);
      events.release(e);
    }
    recording_blocks.free(ptr, /*cache=*/recording_step());
    return requested;
  }

  // ---- other streams and sizes ----------------------------------------------------------

  void record_stream(void* ptr, Stream stream) {
    std::unique_lock<std::mutex> lock(mutex);
    if (requested_size_here(ptr)) {
      users.add(ptr, stream);
      return;
    }
    lock.unlock();
    pool.record_stream(ptr, stream);  // throws InvalidPointer for anything else
  }

  // Under the lock: the bytes asked for by ptr when it is a live arena buffer or a live
  // recording block.
  std::optional<std::size_t> requested_size_here(const void* ptr) const {
    const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
    bool is_current = false;
    if (Arena* arena = arenas.find(addr, &is_current)) {
      std::size_t index = 0;
      if (const std::int64_t k = arena->live_slot_at(addr, &index); k >= 0) {
        return arena->requested(static_cast<std::size_t>(k));
      }
    }
    return recording_blocks.requested_size(ptr);
  }

  std::size_t allocation_size(const void* ptr) const {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (const auto size = requested_size_here(ptr)) return *size;
    }
    return pool.allocation_size(ptr);
  }

  // ---- steps ----------------------------------------------------------------------------

  void begin_step(Stream stream) {
    std::lock_guard<std::mutex> lock(mutex);
    if (in_step) throw InvalidArgument(name() + ": begin_step() while a step is in progress");
    // Arena memory freed while another stream still used it is reused from this step on.
    arenas.wait_for_users();
    reserve_arena_again();  // after a trim; refused, every plan goes and this step records
    in_step = true;
    divergent = false;
    choosing = false;
    active.reset();
    cursor = 0;
    if (plans.empty()) {
      plan_stream_handle.store(stream.handle, std::memory_order_relaxed);
      start_recording();
      return;
    }
    // Buffers kept from an earlier step could overlap this step's slots; the plans belong
    // to another stream than this step's.
    const Arena& arena = *arenas.current();
    if (arena.live_count() != 0 || !(stream == arena.stream())) {
      ++counters.planned_steps;
      diverge();
      return;
    }
    choosing = true;
  }

  void end_step() {
    std::lock_guard<std::mutex> lock(mutex);
    if (!in_step) throw InvalidArgument(name() + ": end_step() without begin_step()");
    in_step = false;
    if (recorder.recording()) {
      recording_blocks.release_cache();
      ++counters.recorded_steps;
      const std::size_t recorded = recorder.event_count();
      add_plan(recorder.finish(planner_options_of(options, recorder.seconds_recorded())));
      if (recorder.gave_up()) {
        ++counters.unplanned_steps;
        unplannable_events =
            unplannable_events == 0 ? recorded : std::min(unplannable_events, recorded);
      }
      // The arena the recording gave back (start_recording) is taken again here, so that
      // no later step, of this shape or another, calls the memory for it.
      reserve_arena_again();
      return;
    }
    if (choosing) {  // no plan-stream allocation: the step stopped before any plan's events
      choosing = false;
      ++counters.planned_steps;
      diverge();
    }
    if (active != nullptr && !divergent && cursor != active->events.size()) diverge();
    const std::shared_ptr<StepPlan> followed = std::move(active);
    active.reset();
    const bool was_divergent = divergent;
    divergent = false;
    if (plans.end_step(followed, was_divergent)) {
      if (plans.empty()) arenas.retire();  // the arena goes with the last plan
      ++counters.replans;
    }
  }

  // The arena, released by a trim or for a recording, reserved again; when that is refused
  // (counted), every plan goes.
  void reserve_arena_again() {
    if (plans.empty() || arenas.reserve_again()) return;
    plans.clear();
    arenas.retire();
  }

  // Adds the recording's plan, growing the shared arena if it needs more; a plan whose
  // arena is refused is dropped (counted in arena_failures).
  void add_plan(std::shared_ptr<StepPlan> planned) {
    if (planned == nullptr) return;  // nothing for an arena: such a step records again
    if (!arenas.holds(*planned) && !arenas.grow_for(*planned, plan_stream(), plans.empty())) {
      return;
    }
    plans.add(std::move(planned));
  }

  // ---- memory given back, layout and figures --------------------------------------------

  // What the fallback pool caches, and the arena when no step is in progress and none of its
  // memory is live (the plan stays: the next begin_step reserves the arena again). Lets a
  // pipeline give one stage's arena back before its next stage the way
  // torch.cuda.empty_cache() gives back a cache.
  std::size_t trim() {
    std::size_t released = 0;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!in_step) released += arenas.trim();
    }
    // An arena of the pool's went back into it: what the pool now releases counts its pages.
    if (arenas.from_pool()) released = 0;
    return released + pool.trim();
  }

  PoolLayout layout() const {
    PoolLayout result = pool.has_layout() ? pool.layout() : PoolLayout{};
    std::lock_guard<std::mutex> lock(mutex);
    arenas.add_layout(result);
    recording_blocks.add_layout(result);
    std::sort(result.segments.begin(), result.segments.end(),
              [](const SegmentLayout& a, const SegmentLayout& b) { return a.address < b.address; });
    return result;
  }

  PoolStats stats() const {
    const PoolStats pool_stats = pool.stats();
    std::lock_guard<std::mutex> lock(mutex);
    return combine_stats(pool_stats, recording_blocks.figures(), arenas.figures(), held.stats(),
                         live, arenas.from_pool());
  }

  void reset_peak() {
    pool.reset_peak();
    held.reset_peak();
    live.reset_peak();
  }

  PlannedArenaCounters current_counters() const {
    std::lock_guard<std::mutex> lock(mutex);
    PlannedArenaCounters c = counters;
    const planned_arena_detail::ArenaFigures f = arenas.figures();
    c.arena_failures = f.failures;
    c.prefault_failures = f.prefault_failures;
    return c;
  }
};

// ---- the public API: forwarding to Impl -------------------------------------------------

PlannedArena::PlannedArena(MemoryResource& upstream, PlannedArenaOptions options)
    : PlannedArena(upstream, options, [](MemoryResource& held, const CachingPoolOptions& fallback) {
        return std::make_unique<PoolOf<CachingPool>>(held, fallback);
      }) {}

PlannedArena::PlannedArena(MemoryResource& upstream, PlannedArenaOptions options,
                           const FallbackMaker& make_fallback)
    : impl_(std::make_unique<Impl>(upstream, options, make_fallback)) {}

PlannedArena::~PlannedArena() = default;

void* PlannedArena::allocate(std::size_t bytes, std::size_t alignment, Stream stream) {
  return impl_->allocate(bytes, alignment, stream);
}

void* PlannedArena::do_allocate(std::size_t bytes, Stream stream) {
  return impl_->allocate(bytes, kRounding, stream);
}

void PlannedArena::do_deallocate(void* ptr, std::size_t bytes, Stream stream) {
  impl_->deallocate(ptr, bytes, stream);
}

void PlannedArena::free(void* ptr, Stream stream) { impl_->deallocate(ptr, std::nullopt, stream); }

std::size_t PlannedArena::allocation_size(const void* ptr) const {
  return impl_->allocation_size(ptr);
}

void PlannedArena::record_stream(void* ptr, Stream stream) { impl_->record_stream(ptr, stream); }

void PlannedArena::begin_step() { impl_->begin_step(impl_->plan_stream()); }
void PlannedArena::begin_step(Stream stream) { impl_->begin_step(stream); }
void PlannedArena::end_step() { impl_->end_step(); }

bool PlannedArena::in_step() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->in_step;
}

bool PlannedArena::has_plan() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return !impl_->plans.empty();
}

std::size_t PlannedArena::plan_count() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->plans.size();
}

std::size_t PlannedArena::planned_arena_size() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->arenas.size();
}

std::size_t PlannedArena::planned_events() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->plans.latest_events();
}

Stream PlannedArena::plan_stream() const { return impl_->plan_stream(); }

PoolStats PlannedArena::stats() const { return impl_->stats(); }

void PlannedArena::reset_peak() { impl_->reset_peak(); }

std::size_t PlannedArena::trim() { return impl_->trim(); }

PoolLayout PlannedArena::layout() const { return impl_->layout(); }

PlannedArenaCounters PlannedArena::counters() const { return impl_->current_counters(); }

AnyPool& PlannedArena::fallback_pool() { return impl_->pool; }

void PlannedArena::check_invariants() const {
  impl_->pool.check_invariants();
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (!impl_->plans.within_limit()) {
    throw Error("PlannedArena invariant broken: more plans than max_plans");
  }
  impl_->arenas.check_invariants();
  impl_->recording_blocks.check_invariants();
}

std::string PlannedArena::name() const { return impl_->name(); }

std::size_t PlannedArena::capacity() const { return impl_->upstream.capacity(); }

}  // namespace sdalloc
