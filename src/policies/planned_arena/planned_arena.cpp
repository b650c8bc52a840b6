// policies/planned_arena/planned_arena.cpp - PlannedArena: routes each request to the arena,
// the recording or the fallback pool, and moves the step through its plan.
//
// The pieces (this folder): StepRecorder (what a recorded step captures, and its plan),
// PlanSet (the plans, and which one a step follows), SharedArena (the arena's lifetime and
// occupancy), RecordingBlocks (a recording's blocks straight from the upstream),
// StreamUsers (record_stream), figures (stats), options (their checks), impl.hpp (the state
// of a PlannedArena and its invariants), free_routing.cpp (frees and sizes). This file holds
// the step: begin_step picks how it is served, each plan-stream allocation is matched
// against the next event of the plan (`cursor`), and the first mismatch makes the step
// divergent: from then on the fallback pool serves it. See planned_arena.hpp for the
// contract.
#include "sdalloc/policies/planned_arena.hpp"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/bits.hpp"
#include "policies/planned_arena/impl.hpp"
#include "sdalloc/core/errors.hpp"

namespace sdalloc {

using planned_arena_detail::combine_stats;
using planned_arena_detail::Event;
using planned_arena_detail::kRounding;
using planned_arena_detail::planner_options_of;
using planned_arena_detail::Slot;

PlannedArenaOptions PlannedArena::Impl::validated(PlannedArenaOptions opts) {
  opts.validate();
  return opts;
}

bool PlannedArena::Impl::record_upstream() const {
  return options.record_through_upstream && !options.arena_from_fallback;
}

void PlannedArena::Impl::give_up_recording() {
  recorder.abandon();
  recording_blocks.release_cache();
  ++counters.recorded_steps;
  ++counters.unplanned_steps;
}

void PlannedArena::Impl::diverge() {
  if (!divergent) {
    divergent = true;
    ++counters.divergent_steps;
  }
}

void* PlannedArena::Impl::allocate(std::size_t bytes, std::size_t alignment, Stream stream) {
  void* p = route_allocation(bytes, alignment, stream);
  if (p != nullptr) live.add(bytes, round_up(bytes, kRounding));
  return p;
}

void* PlannedArena::Impl::route_allocation(std::size_t bytes, std::size_t alignment,
                                           Stream stream) {
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
  if (recording_step() && unplannable_events != 0 && recorder.event_count() >= unplannable_events) {
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

void* PlannedArena::Impl::allocate_elsewhere(std::size_t bytes, std::size_t alignment,
                                             Stream stream) {
  void* p = pool.allocate(bytes, alignment, stream);
  if (p != nullptr) {
    std::lock_guard<std::mutex> lock(mutex);
    ++counters.fallback_allocations;
  }
  return p;
}

void PlannedArena::Impl::choose_plan(std::size_t rounded, std::size_t alignment) {
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

void PlannedArena::Impl::start_recording() {
  if (record_upstream()) {
    pool.trim();
    arenas.trim();
  } else if (options.arena_from_fallback) {
    arenas.trim();
  }
  recorder.start();
}

void* PlannedArena::Impl::try_planned(std::size_t bytes, std::size_t rounded,
                                      std::size_t alignment) {
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

void PlannedArena::Impl::begin_step(Stream stream) {
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

void PlannedArena::Impl::end_step() {
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

void PlannedArena::Impl::reserve_arena_again() {
  if (plans.empty() || arenas.reserve_again()) return;
  plans.clear();
  arenas.retire();
}

void PlannedArena::Impl::add_plan(std::shared_ptr<StepPlan> planned) {
  if (planned == nullptr) return;  // nothing for an arena: such a step records again
  if (!arenas.holds(*planned) && !arenas.grow_for(*planned, plan_stream(), plans.empty())) {
    return;
  }
  plans.add(std::move(planned));
}

std::size_t PlannedArena::Impl::trim() {
  std::size_t released = 0;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!in_step) released += arenas.trim();
  }
  // An arena of the pool's went back into it: what the pool now releases counts its pages.
  if (arenas.from_pool()) released = 0;
  return released + pool.trim();
}

PoolLayout PlannedArena::Impl::layout() const {
  PoolLayout result = pool.has_layout() ? pool.layout() : PoolLayout{};
  std::lock_guard<std::mutex> lock(mutex);
  arenas.add_layout(result);
  recording_blocks.add_layout(result);
  std::sort(result.segments.begin(), result.segments.end(),
            [](const SegmentLayout& a, const SegmentLayout& b) { return a.address < b.address; });
  return result;
}

PoolStats PlannedArena::Impl::stats() const {
  const PoolStats pool_stats = pool.stats();
  std::lock_guard<std::mutex> lock(mutex);
  return combine_stats(pool_stats, recording_blocks.figures(), arenas.figures(), held.stats(), live,
                       arenas.from_pool());
}

void PlannedArena::Impl::reset_peak() {
  pool.reset_peak();
  held.reset_peak();
  live.reset_peak();
}

PlannedArenaCounters PlannedArena::Impl::current_counters() const {
  std::lock_guard<std::mutex> lock(mutex);
  PlannedArenaCounters c = counters;
  const planned_arena_detail::ArenaFigures f = arenas.figures();
  c.arena_failures = f.failures;
  c.prefault_failures = f.prefault_failures;
  return c;
}

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
