// planned_arena.cpp - PlannedArena: record one step, plan it, serve later steps by position.
#include "sdalloc/policies/planned_arena.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/resources/host_resource.hpp"
#include "sdalloc/planner/planner.hpp"
#include "sdalloc/core/stream_events.hpp"
#include "core/bits.hpp"

namespace sdalloc {
namespace {

constexpr std::size_t kRounding = CachingPool::kRounding;


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

// One recorded step, planned: the sequence a later step must repeat, and each slot's place.
struct StepPlan {
  std::vector<Slot> slots;
  std::vector<Event> events;
  std::vector<std::size_t> offsets;   // distinct planned offsets, sorted
  std::size_t size = 0;               // bytes it needs from the arena's base
  std::size_t alignment = kRounding;  // its strictest planned alignment
  std::size_t divergent_in_a_row = 0;
  std::uint64_t last_used = 0;  // when a step last followed it: the least recent goes first
};

// The reserved memory every plan places its buffers in (steps never overlap, so the plans
// share it; it is as large as the largest), and which buffer of which plan occupies which
// offset now. While a plan is followed at most one live buffer starts at any offset; a free
// looks the offset up by binary search, so the hot path allocates no memory.
struct Arena {
  void* segment = nullptr;  // null while released by trim() (the plans stay)
  Stream stream;            // the plan stream: arena memory is reused there at once
  std::size_t segment_bytes = 0;
  std::uintptr_t base = 0;
  std::size_t size = 0;                  // the largest plan's size
  std::size_t alignment = 0;             // the strictest planned alignment: base's
  std::shared_ptr<const StepPlan> plan;  // whose buffers occupy it (kept alive while they do)
  std::vector<std::int64_t> occupant;    // per plan offset: live slot or -1
  std::vector<std::size_t> requested;    // per plan slot: bytes asked for while live
  std::size_t live_count = 0;
  std::size_t live_bytes = 0;
  std::size_t allocated_bytes = 0;

  bool reserved() const { return segment != nullptr; }
  bool contains(std::uintptr_t p) const { return reserved() && p >= base && p < base + size; }
  // Makes `p` the plan whose buffers the arena holds (it must be empty).
  void occupy(std::shared_ptr<const StepPlan> p) {
    occupant.assign(p->offsets.size(), -1);
    requested.assign(p->slots.size(), 0);
    plan = std::move(p);
  }
  // The slot whose live buffer starts at p, or -1.
  std::int64_t live_slot_at(std::uintptr_t p, std::size_t* index) const {
    if (!contains(p) || plan == nullptr) return -1;
    const std::vector<std::size_t>& offsets = plan->offsets;
    const std::size_t offset = p - base;
    const auto pos = std::lower_bound(offsets.begin(), offsets.end(), offset);
    if (pos == offsets.end() || *pos != offset) return -1;
    *index = static_cast<std::size_t>(pos - offsets.begin());
    return occupant[*index];
  }
  std::size_t rounded(std::size_t slot) const { return plan->slots[slot].rounded; }
};

// A recorded allocation served by the upstream resource itself.
struct DirectAllocation {
  void* raw = nullptr;        // what the upstream returned
  std::size_t raw_bytes = 0;  // what was asked of the upstream
  std::size_t rounded = 0;    // the block handed out: [pointer, pointer + rounded)
  std::size_t requested = 0;  // what the caller asked for
  Stream stream;              // the plan stream it was taken on
};

}  // namespace

void PlannedArenaOptions::validate() const {
  if (replan_after_divergent_steps == 0) {
    throw InvalidArgument("PlannedArenaOptions: replan_after_divergent_steps must be >= 1");
  }
  if (max_plans == 0) throw InvalidArgument("PlannedArenaOptions: max_plans must be >= 1");
  if (!(planner_time_limit_seconds >= 0.0)) {
    throw InvalidArgument("PlannedArenaOptions: planner_time_limit_seconds must be >= 0");
  }
  fallback.validate();
}

struct PlannedArena::Impl {
  Impl(MemoryResource& up, PlannedArenaOptions opts)
      : upstream(up),
        options(validated(opts)),
        pool(up, options.fallback),
        events(options.fallback.stream_events != nullptr ? *options.fallback.stream_events
                                                         : HostStreamEvents::instance()),
        plan_stream_handle(options.plan_stream.handle) {}

  static PlannedArenaOptions validated(PlannedArenaOptions opts) {
    opts.validate();
    return opts;
  }

  ~Impl() {
    for (const auto& [ptr, d] : direct_live) upstream.deallocate(d.raw, d.raw_bytes, d.stream);
    release_recording_cache();
    wait_for_arena_users();
    if (current) release(*current);
    for (auto& arena : retired) release(*arena);
  }

  MemoryResource& upstream;
  const PlannedArenaOptions options;
  CachingPool pool;
  StreamEvents& events;

  // The stream whose sequence is planned: set by begin_step(stream) when a step is recorded.
  // Written under `mutex`; read without it to send other streams to the pool at once.
  std::atomic<std::uintptr_t> plan_stream_handle;
  Stream plan_stream() const { return Stream(plan_stream_handle.load(std::memory_order_relaxed)); }

  mutable std::mutex mutex;
  // The plans (at most options.max_plans) and the arena they share.
  std::vector<std::shared_ptr<StepPlan>> plans;
  std::unique_ptr<Arena> current;
  // Arenas that were replaced or dropped while memory in them was live; released when they
  // empty.
  std::vector<std::unique_ptr<Arena>> retired;
  std::uint64_t use_clock = 0;
  std::size_t unmatched_in_a_row = 0;  // divergent steps that followed no plan

  // The step in progress.
  bool in_step = false;
  bool choosing = false;             // plans exist; the step's first allocation picks one
  bool recording = false;            // the step is being recorded
  bool divergent = false;            // the step left its plan (or matched none)
  std::shared_ptr<StepPlan> active;  // the plan the step follows
  std::size_t cursor = 0;            // next event of the plan the step must match
  // The recording: slot k is its k-th allocation.
  std::vector<Slot> rec_slots;
  std::vector<Event> rec_events;
  std::unordered_map<void*, std::uint32_t> recording_live;  // recorded ptr -> slot
  // Recorded allocations taken straight from the upstream (record_through_upstream), by the
  // pointer handed out; they may outlive their step. A recorded free keeps its block in
  // recording_cache for a later request of exactly its size (a step repeats its sizes, and
  // a reused block is not faulted in again); before taking more from the upstream, cached
  // blocks are returned until what is held is no more than the most that was live, so the
  // recording holds what is live and never a cache beyond that peak.
  std::unordered_map<void*, DirectAllocation> direct_live;
  std::multimap<std::size_t, void*> recording_cache;  // raw bytes -> raw pointer
  std::size_t direct_held_bytes = 0;      // raw bytes of direct_live and recording_cache
  std::size_t direct_live_raw_bytes = 0;  // raw bytes of direct_live
  std::size_t direct_live_rounded_bytes = 0;
  std::size_t direct_live_bytes = 0;           // requested bytes of direct_live
  std::size_t direct_peak_live_raw_bytes = 0;  // bounds the recording cache (make_room)
  std::size_t direct_peak_held_bytes = 0;      // this and the next: statistics only
  std::size_t direct_peak_rounded_bytes = 0;
  std::size_t direct_peak_live_bytes = 0;
  std::size_t direct_peak_count = 0;
  std::size_t direct_peak_blocks = 0;    // live and cached
  std::uint64_t direct_allocations = 0;  // requests served
  std::uint64_t direct_frees = 0;
  std::uint64_t upstream_allocations = 0;  // blocks taken from the upstream
  std::uint64_t upstream_releases = 0;

  // record_stream on arena or direct memory: the other streams that use each live buffer.
  // When such a buffer is freed, an event is recorded on each; arena memory is not reused
  // until they complete (begin_step and any arena release wait), a direct block is not
  // cached or released before they complete (its free waits).
  std::unordered_map<void*, std::vector<Stream>> used_on;
  std::vector<StreamEvents::Event> arena_waits;

  PlannedArenaCounters counters;
  std::size_t arena_peak_live = 0;
  std::size_t arena_peak_allocated = 0;
  std::size_t arena_peak_live_allocations = 0;
  std::size_t arena_peak_segments = 0;
  std::uint64_t arena_allocations = 0;
  std::uint64_t arena_frees = 0;
  std::uint64_t arena_segment_allocations = 0;
  std::uint64_t arena_segment_releases = 0;

  void wait_for_arena_users() {
    for (const StreamEvents::Event e : arena_waits) {
      events.synchronize(e);
      events.release(e);
    }
    arena_waits.clear();
  }

  void release(Arena& arena) {
    if (!arena.reserved()) return;
    wait_for_arena_users();
    upstream.deallocate(arena.segment, arena.segment_bytes, arena.stream);
    arena.segment = nullptr;
    ++arena_segment_releases;
  }

  std::size_t arena_count() const {
    return (current && current->reserved() ? 1 : 0) + retired.size();
  }

  template <typename F>
  std::size_t sum_arenas(F figure) const {
    std::size_t total = current ? figure(*current) : 0;
    for (const auto& arena : retired) total += figure(*arena);
    return total;
  }

  void diverge() {
    if (!divergent) {
      divergent = true;
      ++counters.divergent_steps;
    }
  }

  bool planned_step_active() const { return in_step && !recording && active != nullptr; }

  void* allocate(std::size_t bytes, std::size_t alignment, Stream stream) {
    if (!(stream == plan_stream())) return allocate_elsewhere(bytes, alignment, stream);
    const bool valid = is_power_of_two(alignment) && alignment <= CachingPool::kMaxAlignment &&
                       bytes <= CachingPool::kMaxAllocation;
    if (!valid || bytes == 0) return pool.allocate(bytes, alignment, stream);  // throws or null

    std::unique_lock<std::mutex> lock(mutex);
    if (!(stream == plan_stream())) {  // a begin_step on another thread moved the plan
      lock.unlock();
      return allocate_elsewhere(bytes, alignment, stream);
    }
    const std::size_t rounded = round_up(bytes, kRounding);
    const std::size_t effective_alignment = std::max(alignment, kRounding);
    if (in_step && choosing) choose_plan(rounded, effective_alignment);
    if (planned_step_active() && !divergent) {
      if (void* p = try_planned(bytes, rounded, effective_alignment)) return p;
      diverge();
    }
    if (in_step && recording && options.record_through_upstream) {
      void* p = allocate_direct(bytes, rounded, effective_alignment);
      ++counters.recorded_allocations;
      record_allocation(p, rounded, effective_alignment);
      return p;
    }
    void* p = pool.allocate(bytes, alignment, stream);
    ++counters.fallback_allocations;
    if (in_step && recording) {
      ++counters.recorded_allocations;
      record_allocation(p, rounded, effective_alignment);
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

  // The upstream guarantees kMinAlignment; a stricter alignment takes slack to align up.
  void* allocate_direct(std::size_t bytes, std::size_t rounded, std::size_t alignment) {
    const std::size_t raw_bytes =
        rounded + (alignment > kMinAlignment ? alignment - kMinAlignment : 0);
    const Stream stream = plan_stream();
    void* raw = nullptr;
    if (const auto cached = recording_cache.find(raw_bytes); cached != recording_cache.end()) {
      raw = cached->second;
      recording_cache.erase(cached);
    } else {
      make_room(raw_bytes);
      try {
        raw = upstream.allocate(raw_bytes, stream);
      } catch (const OutOfMemory&) {
        if (recording_cache.empty()) throw;
        release_recording_cache();  // all of it, then once more
        raw = upstream.allocate(raw_bytes, stream);
      }
      ++upstream_allocations;
      direct_held_bytes += raw_bytes;
    }
    void* p = reinterpret_cast<void*>(round_up(reinterpret_cast<std::uintptr_t>(raw), alignment));
    try {
      direct_live.emplace(p, DirectAllocation{raw, raw_bytes, rounded, bytes, stream});
    } catch (...) {
      release_raw(raw, raw_bytes);
      throw;
    }
    direct_live_raw_bytes += raw_bytes;
    direct_live_rounded_bytes += rounded;
    direct_live_bytes += bytes;
    direct_peak_held_bytes = std::max(direct_peak_held_bytes, direct_held_bytes);
    direct_peak_live_raw_bytes = std::max(direct_peak_live_raw_bytes, direct_live_raw_bytes);
    direct_peak_rounded_bytes = std::max(direct_peak_rounded_bytes, direct_live_rounded_bytes);
    direct_peak_live_bytes = std::max(direct_peak_live_bytes, direct_live_bytes);
    direct_peak_count = std::max(direct_peak_count, direct_live.size());
    direct_peak_blocks = std::max(direct_peak_blocks, direct_live.size() + recording_cache.size());
    ++direct_allocations;
    return p;
  }

  // Returns cached blocks, largest first, until `need` more bytes keep what is held within
  // the most that was (or is about to be) live.
  void make_room(std::size_t need) {
    const std::size_t bound = std::max(direct_peak_live_raw_bytes, direct_live_raw_bytes + need);
    while (direct_held_bytes + need > bound && !recording_cache.empty()) {
      const auto largest = std::prev(recording_cache.end());
      const auto [raw_bytes, raw] = *largest;
      recording_cache.erase(largest);
      release_raw(raw, raw_bytes);
    }
  }

  void release_raw(void* raw, std::size_t raw_bytes) {
    upstream.deallocate(raw, raw_bytes, plan_stream());
    direct_held_bytes -= raw_bytes;
    ++upstream_releases;
  }

  void release_recording_cache() {
    for (const auto& [raw_bytes, raw] : recording_cache) release_raw(raw, raw_bytes);
    recording_cache.clear();
  }

  // Appends to `recorded` an event on each other stream that used ptr (record_stream),
  // which the free must honour, and forgets them; false when record_stream never named ptr.
  bool record_users(void* ptr, std::vector<StreamEvents::Event>& recorded) {
    const auto it = used_on.find(ptr);
    if (it == used_on.end()) return false;
    for (const Stream s : it->second) {
      if (const StreamEvents::Event e = events.record(s); e != StreamEvents::kNoEvent) {
        recorded.push_back(e);
      }
    }
    used_on.erase(it);
    return true;
  }

  void check_size(std::optional<std::size_t> bytes, std::size_t requested) const {
    if (bytes && *bytes != requested) {
      throw InvalidArgument(name() + ": free of " + std::to_string(*bytes) +
                            " bytes, but the allocation was " + std::to_string(requested) +
                            " bytes");
    }
  }

  // Returns false when ptr is not a direct allocation.
  bool deallocate_direct(void* ptr, std::optional<std::size_t> bytes) {
    const auto it = direct_live.find(ptr);
    if (it == direct_live.end()) return false;
    const DirectAllocation d = it->second;
    check_size(bytes, d.requested);
    // Another stream may still use it: its block is neither cached nor released before that
    // work is done. Rare (record_stream during a recorded step), so the free simply waits.
    std::vector<StreamEvents::Event> users;
    record_users(ptr, users);
    for (const StreamEvents::Event e : users) {
      events.synchronize(e);
      events.release(e);
    }
    direct_live.erase(it);
    direct_live_raw_bytes -= d.raw_bytes;
    direct_live_rounded_bytes -= d.rounded;
    direct_live_bytes -= d.requested;
    ++direct_frees;
    bool cached = false;
    if (in_step && recording) {
      try {
        recording_cache.emplace(d.raw_bytes, d.raw);
        cached = true;
      } catch (const std::bad_alloc&) {  // no node for the cache: give the block back
      }
    }
    if (!cached) release_raw(d.raw, d.raw_bytes);
    return true;
  }

  // The step's first plan-stream allocation picks the most recently followed plan that
  // begins with it; with none, the step is recorded as a new plan while there is room, and
  // otherwise served by the fallback pool (divergent).
  void choose_plan(std::size_t rounded, std::size_t alignment) {
    choosing = false;
    std::shared_ptr<StepPlan> best;
    for (const auto& plan : plans) {
      const Slot& first = plan->slots[plan->events.front().slot];
      if (first.rounded == rounded && first.alignment == alignment &&
          (best == nullptr || plan->last_used > best->last_used)) {
        best = plan;
      }
    }
    if (best != nullptr) {
      active = std::move(best);
      active->last_used = ++use_clock;
      current->occupy(active);
      ++counters.planned_steps;
      return;
    }
    if (plans.size() < options.max_plans) {
      start_recording();
      return;
    }
    ++counters.planned_steps;
    diverge();
  }

  void start_recording() {
    recording = true;
    rec_slots.clear();
    rec_events.clear();
    recording_live.clear();
  }

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
    Arena& arena = *current;
    // Cannot happen while the step follows the recording; checked so that a bug here shows
    // as a fallback, never as two live buffers at one address.
    if (arena.occupant[slot.offset_index] != -1) return nullptr;
    arena.occupant[slot.offset_index] = k;
    arena.requested[k] = bytes;
    ++arena.live_count;
    arena.live_bytes += bytes;
    arena.allocated_bytes += rounded;
    ++cursor;
    ++counters.planned_allocations;
    ++arena_allocations;
    update_arena_peaks();
    return reinterpret_cast<void*>(arena.base + slot.offset);
  }

  void update_arena_peaks() {
    arena_peak_live =
        std::max(arena_peak_live, sum_arenas([](const Arena& a) { return a.live_bytes; }));
    arena_peak_allocated = std::max(arena_peak_allocated,
                                    sum_arenas([](const Arena& a) { return a.allocated_bytes; }));
    arena_peak_live_allocations = std::max(arena_peak_live_allocations,
                                           sum_arenas([](const Arena& a) { return a.live_count; }));
  }

  void record_allocation(void* p, std::size_t rounded, std::size_t alignment) {
    const auto k = static_cast<std::uint32_t>(rec_slots.size());
    Slot slot;
    slot.rounded = rounded;
    slot.alignment = alignment;
    slot.allocated_at = static_cast<std::int64_t>(rec_events.size());
    rec_slots.push_back(slot);
    rec_events.push_back(Event{true, k});
    recording_live.emplace(p, k);
  }

  // `bytes` is the caller's byte count, checked against the allocation; nullopt: not known
  // (the size-less free of the C API and PyTorch's shim).
  void deallocate(void* ptr, std::optional<std::size_t> bytes, Stream stream) {
    if (ptr == nullptr) return;
    std::unique_lock<std::mutex> lock(mutex);
    const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
    if (current && current->contains(addr)) {
      free_in_arena(*current, addr, bytes, stream, /*is_current=*/true);
      return;
    }
    for (auto it = retired.begin(); it != retired.end(); ++it) {
      if (!(*it)->contains(addr)) continue;
      free_in_arena(**it, addr, bytes, stream, /*is_current=*/false);
      if ((*it)->live_count == 0) {
        release(**it);
        retired.erase(it);
      }
      return;
    }
    const bool direct = deallocate_direct(ptr, bytes);
    if (!direct && !(in_step && recording)) {
      lock.unlock();
      pool_free(ptr, bytes, stream);  // checks the pointer and the size
      return;
    }
    if (!direct) pool_free(ptr, bytes, stream);
    if (!(in_step && recording)) return;
    auto it = recording_live.find(ptr);
    if (it != recording_live.end()) {
      rec_slots[it->second].freed_at = static_cast<std::int64_t>(rec_events.size());
      rec_events.push_back(Event{false, it->second});
      recording_live.erase(it);
    }
  }

  void pool_free(void* ptr, std::optional<std::size_t> bytes, Stream stream) {
    if (bytes) {
      pool.deallocate(ptr, *bytes, stream);
    } else {
      pool.free(ptr, stream);
    }
  }

  void free_in_arena(Arena& arena, std::uintptr_t addr, std::optional<std::size_t> bytes,
                     Stream stream, bool is_current) {
    std::size_t index = 0;
    const std::int64_t slot = arena.live_slot_at(addr, &index);
    if (slot < 0) {
      throw InvalidPointer(name() + ": free of a pointer that is not a live allocation (" +
                               "freed already, or inside a planned buffer)",
                           reinterpret_cast<const void*>(addr));
    }
    const auto k = static_cast<std::size_t>(slot);
    check_size(bytes, arena.requested[k]);
    std::vector<StreamEvents::Event> users;
    const bool named_elsewhere = record_users(reinterpret_cast<void*>(addr), users);
    // Diverges whether or not an event was needed (host streams have none), so a step
    // behaves the same on every backend.
    const bool used_elsewhere = named_elsewhere || !(stream == arena.stream);
    if (!(stream == arena.stream)) {  // freed for reuse on another stream than the arena's
      if (const StreamEvents::Event e = events.record(stream); e != StreamEvents::kNoEvent) {
        users.push_back(e);
      }
    }
    arena_waits.insert(arena_waits.end(), users.begin(), users.end());
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
    arena.occupant[index] = -1;
    --arena.live_count;
    arena.live_bytes -= arena.requested[k];
    arena.allocated_bytes -= arena.rounded(k);
    arena.requested[k] = 0;
    ++arena_frees;
  }

  void record_stream(void* ptr, Stream stream) {
    std::unique_lock<std::mutex> lock(mutex);
    if (is_live_here(ptr)) {
      std::vector<Stream>& streams = used_on[ptr];
      if (std::find(streams.begin(), streams.end(), stream) == streams.end()) {
        streams.push_back(stream);
      }
      return;
    }
    lock.unlock();
    pool.record_stream(ptr, stream);  // throws InvalidPointer for anything else
  }

  // Under the lock: is ptr a live arena buffer or a live direct allocation?
  bool is_live_here(const void* ptr) const { return requested_size_here(ptr).has_value(); }

  std::optional<std::size_t> requested_size_here(const void* ptr) const {
    const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
    std::size_t index = 0;
    if (current) {
      if (const std::int64_t k = current->live_slot_at(addr, &index); k >= 0) {
        return current->requested[static_cast<std::size_t>(k)];
      }
    }
    for (const auto& arena : retired) {
      if (const std::int64_t k = arena->live_slot_at(addr, &index); k >= 0) {
        return arena->requested[static_cast<std::size_t>(k)];
      }
    }
    if (const auto it = direct_live.find(const_cast<void*>(ptr)); it != direct_live.end()) {
      return it->second.requested;
    }
    return std::nullopt;
  }

  std::size_t allocation_size(const void* ptr) const {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (const auto size = requested_size_here(ptr)) return *size;
    }
    return pool.allocation_size(ptr);
  }

  void begin_step(Stream stream) {
    std::lock_guard<std::mutex> lock(mutex);
    if (in_step) throw InvalidArgument(name() + ": begin_step() while a step is in progress");
    // Arena memory freed while another stream still used it is reused from this step on.
    wait_for_arena_users();
    if (current && !current->reserved() && !reserve(*current)) drop_all_plans();  // counted
    in_step = true;
    divergent = false;
    recording = false;
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
    if (current->live_count != 0 || !(stream == current->stream)) {
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
    if (recording) {
      recording = false;
      recording_live.clear();
      release_recording_cache();
      ++counters.recorded_steps;
      make_plan();
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
    if (!divergent) {  // a step that followed no plan is always divergent; checked anyway
      if (followed != nullptr) followed->divergent_in_a_row = 0;
      unmatched_in_a_row = 0;
      return;
    }
    divergent = false;
    // Too many divergent steps in a row: the plan that keeps failing goes (for steps that
    // matched no plan, the least recently followed one), and a later step records anew.
    if (followed != nullptr) {
      if (++followed->divergent_in_a_row < options.replan_after_divergent_steps) return;
      drop_plan(followed);
    } else {
      if (++unmatched_in_a_row < options.replan_after_divergent_steps) return;
      unmatched_in_a_row = 0;
      drop_plan(*std::min_element(plans.begin(), plans.end(), [](const auto& a, const auto& b) {
        return a->last_used < b->last_used;
      }));
    }
    ++counters.replans;
  }

  // Removes one plan; the arena goes with the last one (at once, or when its memory empties).
  void drop_plan(const std::shared_ptr<StepPlan>& plan) {
    plans.erase(std::find(plans.begin(), plans.end(), plan));
    if (plans.empty()) retire_arena();
  }

  void drop_all_plans() {
    plans.clear();
    retire_arena();
  }

  void retire_arena() {
    if (!current) return;
    if (current->live_count == 0) {
      release(*current);
    } else {
      retired.push_back(std::move(current));
    }
    current.reset();
  }

  // Takes the arena's memory from the upstream; false (counted) when it is refused.
  bool reserve(Arena& arena) {
    // What the fallback pool cached is not needed once the arena serves the step; returning
    // it first keeps the peak at the arena, not arena + cache.
    pool.trim();
    try {
      arena.segment = upstream.allocate(arena.segment_bytes, arena.stream);
    } catch (const OutOfMemory&) {
      ++counters.arena_failures;
      return false;
    }
    ++arena_segment_allocations;
    if (options.prefault_host_arena && !prefault_host_pages(arena.segment, arena.segment_bytes)) {
      // Only a speed-up: the pages will still be faulted in on first use.
      ++counters.prefault_failures;
    }
    arena.base = round_up(reinterpret_cast<std::uintptr_t>(arena.segment), arena.alignment);
    // A new arena is not current yet: count it with the ones held.
    arena_peak_segments =
        std::max(arena_peak_segments, arena_count() + (&arena == current.get() ? 0 : 1));
    return true;
  }

  // Plans the recording and adds it to the plans, growing the shared arena if it needs more.
  void make_plan() {
    // Kept slots are not planned: later steps take them from the fallback pool.
    auto planned = std::make_shared<StepPlan>();
    std::vector<Buffer> buffers;
    std::vector<std::size_t> planned_slots;
    for (std::size_t k = 0; k < rec_slots.size(); ++k) {
      Slot& s = rec_slots[k];
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
    if (buffers.empty()) return;  // nothing for an arena: such a step records again
    PlannerOptions planner_options;
    planner_options.time_limit_seconds = options.planner_time_limit_seconds;
    const PlanResult result = plan(buffers, planner_options);
    planned->size = static_cast<std::size_t>(result.plan.arena_size);
    for (std::size_t i = 0; i < planned_slots.size(); ++i) {
      rec_slots[planned_slots[i]].offset = static_cast<std::size_t>(result.plan.offsets[i]);
      planned->offsets.push_back(rec_slots[planned_slots[i]].offset);
    }
    std::sort(planned->offsets.begin(), planned->offsets.end());
    planned->offsets.erase(std::unique(planned->offsets.begin(), planned->offsets.end()),
                           planned->offsets.end());
    for (Slot& s : rec_slots) {
      s.offset_index = static_cast<std::size_t>(
          std::lower_bound(planned->offsets.begin(), planned->offsets.end(), s.offset) -
          planned->offsets.begin());
    }
    planned->slots = std::move(rec_slots);
    planned->events = std::move(rec_events);
    rec_slots.clear();
    rec_events.clear();
    if (!current || planned->size > current->size || planned->alignment > current->alignment) {
      if (!grow_arena(*planned)) return;  // counted in arena_failures; the plan is dropped
    }
    planned->last_used = ++use_clock;
    plans.push_back(std::move(planned));
  }

  // Replaces the arena by one that fits `plan` as well as every plan it served.
  bool grow_arena(const StepPlan& plan) {
    auto arena = std::make_unique<Arena>();
    arena->stream = plan_stream();
    arena->size = std::max(plan.size, current ? current->size : 0);
    arena->alignment = std::max(plan.alignment, current ? current->alignment : kRounding);
    // The upstream guarantees kMinAlignment; stricter planned alignments need slack to align
    // the base.
    arena->segment_bytes =
        arena->size + (arena->alignment > kMinAlignment ? arena->alignment - kMinAlignment : 0);
    // An empty old arena's memory goes first, so that the upstream never holds both. Should
    // the new arena be refused, the old one stays for the plans there are (reserved again
    // at the next begin_step() if it was released here).
    if (current && current->live_count == 0) release(*current);
    if (!reserve(*arena)) {
      if (plans.empty()) retire_arena();
      return false;
    }
    retire_arena();  // released above, or kept until the buffers still in it are freed
    current = std::move(arena);
    return true;
  }

  // What the fallback pool caches, and the arena when no step is in progress and none of its memory
  // is live (the plan stays: the next begin_step reserves the arena again). Lets a pipeline give
  // the denoiser's arena back before its next stage (the VAE) the way torch.cuda.empty_cache()
  // gives back a cache.
  std::size_t trim() {
    std::size_t released = 0;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!in_step && current && current->reserved() && current->live_count == 0) {
        released += current->segment_bytes;
        release(*current);
      }
    }
    return released + pool.trim();
  }

  PoolLayout layout() const {
    PoolLayout result = pool.layout();
    std::lock_guard<std::mutex> lock(mutex);
    const auto add_arena = [&](const Arena& a) {
      if (!a.reserved()) return;
      SegmentLayout segment;
      segment.address = reinterpret_cast<std::uintptr_t>(a.segment);
      segment.size = a.segment_bytes;
      segment.stream = a.stream;
      std::uintptr_t at = segment.address;
      for (std::size_t i = 0; i < a.occupant.size(); ++i) {
        if (a.occupant[i] < 0) continue;
        const auto k = static_cast<std::size_t>(a.occupant[i]);
        const std::uintptr_t start = a.base + a.plan->offsets[i];
        if (start > at) segment.blocks.push_back({at, start - at, 0, BlockState::kFree});
        segment.blocks.push_back({start, a.rounded(k), a.requested[k], BlockState::kLive});
        at = start + a.rounded(k);
      }
      const std::uintptr_t end = segment.address + segment.size;
      if (end > at) segment.blocks.push_back({at, end - at, 0, BlockState::kFree});
      result.segments.push_back(std::move(segment));
    };
    if (current) add_arena(*current);
    for (const auto& arena : retired) add_arena(*arena);
    for (const auto& [ptr, d] : direct_live) {
      SegmentLayout segment;
      segment.address = reinterpret_cast<std::uintptr_t>(d.raw);
      segment.size = d.raw_bytes;
      segment.stream = d.stream;
      const auto start = reinterpret_cast<std::uintptr_t>(ptr);
      const std::uintptr_t end = segment.address + segment.size;
      if (start > segment.address) {
        segment.blocks.push_back({segment.address, start - segment.address, 0, BlockState::kFree});
      }
      segment.blocks.push_back({start, d.rounded, d.requested, BlockState::kLive});
      if (end > start + d.rounded) {
        segment.blocks.push_back(
            {start + d.rounded, end - start - d.rounded, 0, BlockState::kFree});
      }
      result.segments.push_back(std::move(segment));
    }
    for (const auto& [raw_bytes, raw] : recording_cache) {
      SegmentLayout segment;
      segment.address = reinterpret_cast<std::uintptr_t>(raw);
      segment.size = raw_bytes;
      segment.stream = plan_stream();
      segment.blocks.push_back({segment.address, raw_bytes, 0, BlockState::kFree});
      result.segments.push_back(std::move(segment));
    }
    std::sort(result.segments.begin(), result.segments.end(),
              [](const SegmentLayout& a, const SegmentLayout& b) { return a.address < b.address; });
    return result;
  }

  PoolStats stats() const {
    PoolStats s = pool.stats();
    std::lock_guard<std::mutex> lock(mutex);
    const std::size_t live = sum_arenas([](const Arena& a) { return a.live_bytes; });
    const std::size_t allocated = sum_arenas([](const Arena& a) { return a.allocated_bytes; });
    const std::size_t reserved =
        sum_arenas([](const Arena& a) { return a.reserved() ? a.segment_bytes : 0; });
    const std::size_t count = sum_arenas([](const Arena& a) { return a.live_count; });
    s.live_bytes += live + direct_live_bytes;
    s.peak_live_bytes += direct_peak_live_bytes;
    s.allocated_bytes += direct_live_rounded_bytes;
    s.peak_allocated_bytes += direct_peak_rounded_bytes;
    s.reserved_bytes += direct_held_bytes;
    s.peak_reserved_bytes += direct_peak_held_bytes;
    s.live_allocations += direct_live.size();
    s.peak_live_allocations += direct_peak_count;
    s.allocations += direct_allocations;
    s.frees += direct_frees;
    s.segments += direct_live.size() + recording_cache.size();
    s.peak_segments += direct_peak_blocks;
    s.segment_allocations += upstream_allocations;
    s.segment_releases += upstream_releases;
    s.peak_live_bytes += arena_peak_live;
    s.allocated_bytes += allocated;
    s.peak_allocated_bytes += arena_peak_allocated;
    s.reserved_bytes += reserved;
    s.peak_reserved_bytes = std::max(s.peak_reserved_bytes + reserved, s.reserved_bytes);
    s.live_allocations += count;
    s.peak_live_allocations += arena_peak_live_allocations;
    s.allocations += arena_allocations;
    s.frees += arena_frees;
    s.segments += arena_count();
    s.peak_segments += arena_peak_segments;
    s.segment_allocations += arena_segment_allocations;
    s.segment_releases += arena_segment_releases;
    s.free_bytes = s.reserved_bytes - s.allocated_bytes;
    return s;
  }

  void reset_peak() {
    pool.reset_peak();
    std::lock_guard<std::mutex> lock(mutex);
    arena_peak_live = sum_arenas([](const Arena& a) { return a.live_bytes; });
    arena_peak_allocated = sum_arenas([](const Arena& a) { return a.allocated_bytes; });
    arena_peak_live_allocations = sum_arenas([](const Arena& a) { return a.live_count; });
    arena_peak_segments = arena_count();
    direct_peak_held_bytes = direct_held_bytes;
    direct_peak_rounded_bytes = direct_live_rounded_bytes;
    direct_peak_live_bytes = direct_live_bytes;
    direct_peak_count = direct_live.size();
    direct_peak_blocks = direct_live.size() + recording_cache.size();
  }

  std::string name() const { return "planned(" + upstream.name() + ")"; }
};

PlannedArena::PlannedArena(MemoryResource& upstream, PlannedArenaOptions options)
    : impl_(std::make_unique<Impl>(upstream, options)) {}

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
  return impl_->current ? impl_->current->size : 0;
}

std::size_t PlannedArena::planned_events() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const auto& plans = impl_->plans;
  const auto latest =
      std::max_element(plans.begin(), plans.end(),
                       [](const auto& a, const auto& b) { return a->last_used < b->last_used; });
  return latest == plans.end() ? 0 : (*latest)->events.size();
}

Stream PlannedArena::plan_stream() const { return impl_->plan_stream(); }

PoolStats PlannedArena::stats() const { return impl_->stats(); }

void PlannedArena::reset_peak() { impl_->reset_peak(); }

std::size_t PlannedArena::trim() { return impl_->trim(); }

PoolLayout PlannedArena::layout() const { return impl_->layout(); }

PlannedArenaCounters PlannedArena::counters() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->counters;
}

CachingPool& PlannedArena::fallback_pool() { return impl_->pool; }

std::string PlannedArena::name() const { return impl_->name(); }

std::size_t PlannedArena::capacity() const { return impl_->upstream.capacity(); }

}  // namespace sdalloc

namespace sdalloc {

// --- invariants ----------------------------------------------------------------------------

void PlannedArena::check_invariants() const {
  impl_->pool.check_invariants();
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const Impl& m = *impl_;
  const auto broken = [](const std::string& what) {
    throw Error("PlannedArena invariant broken: " + what);
  };
  if (m.plans.size() > m.options.max_plans) broken("more plans than max_plans");
  const auto check_arena = [&](const Arena& arena) {
    std::size_t count = 0;
    std::size_t live = 0;
    std::size_t allocated = 0;
    if (arena.plan != nullptr) {
      if (arena.occupant.size() != arena.plan->offsets.size()) broken("occupant table size");
      for (std::size_t i = 0; i < arena.occupant.size(); ++i) {
        const std::int64_t slot = arena.occupant[i];
        if (slot < 0) continue;
        const auto k = static_cast<std::size_t>(slot);
        if (k >= arena.plan->slots.size()) broken("occupant names no slot of the plan");
        if (arena.plan->offsets[i] + arena.rounded(k) > arena.size) broken("buffer past arena");
        ++count;
        live += arena.requested[k];
        allocated += arena.rounded(k);
      }
    }
    if (count != arena.live_count) broken("arena live count disagrees with its buffers");
    if (live != arena.live_bytes) broken("arena live bytes disagree with its buffers");
    if (allocated != arena.allocated_bytes) broken("arena allocated bytes disagree");
    if (count != 0 && !arena.reserved()) broken("live buffers in a released arena");
  };
  if (m.current) check_arena(*m.current);
  for (const auto& arena : m.retired) check_arena(*arena);
  std::size_t raw = 0;
  std::size_t rounded = 0;
  std::size_t requested = 0;
  for (const auto& [ptr, d] : m.direct_live) {
    raw += d.raw_bytes;
    rounded += d.rounded;
    requested += d.requested;
  }
  std::size_t cached = 0;
  for (const auto& [bytes, ptr] : m.recording_cache) cached += bytes;
  if (raw != m.direct_live_raw_bytes) broken("direct raw bytes disagree with direct blocks");
  if (rounded != m.direct_live_rounded_bytes) broken("direct rounded bytes disagree");
  if (requested != m.direct_live_bytes) broken("direct live bytes disagree");
  if (raw + cached != m.direct_held_bytes) broken("direct held bytes disagree with blocks");
}

}  // namespace sdalloc
