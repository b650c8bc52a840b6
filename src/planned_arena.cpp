// planned_arena.cpp - PlannedArena: record one step, plan it, serve later steps by position.
#include "sdalloc/planned_arena.hpp"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "sdalloc/errors.hpp"
#include "sdalloc/host_resource.hpp"
#include "sdalloc/planner.hpp"

namespace sdalloc {
namespace {

constexpr std::size_t kRounding = CachingPool::kRounding;

bool is_power_of_two(std::size_t v) { return v != 0 && (v & (v - 1)) == 0; }
std::size_t round_up(std::size_t v, std::size_t to) { return (v + to - 1) / to * to; }

// One allocation of the recorded step; slot k is the k-th allocation.
struct Slot {
  std::size_t rounded = 0;        // size after rounding to kRounding: what must match
  std::size_t alignment = 0;      // max(requested alignment, kRounding): must match too
  std::int64_t allocated_at = 0;  // event index of the allocation
  std::int64_t freed_at = -1;     // event index of the free, -1 while live
  std::size_t offset = 0;         // in the arena, once planned
  std::size_t offset_index = 0;   // index into Arena::offsets
};

// The recorded sequence: an allocation of slot k, or the free of slot k.
struct Event {
  bool is_alloc;
  std::uint32_t slot;
};

// One reserved arena and the bookkeeping of which planned buffer occupies which offset.
// While the plan is followed at most one live buffer starts at any offset; a free looks the
// offset up by binary search, so the hot path allocates no memory.
struct Arena {
  void* segment = nullptr;
  std::size_t segment_bytes = 0;
  std::uintptr_t base = 0;
  std::size_t size = 0;                // plan.arena_size
  std::vector<std::size_t> offsets;    // distinct planned offsets, sorted
  std::vector<std::int64_t> occupant;  // per offset: live slot or -1
  std::vector<std::size_t> requested;  // per slot: bytes asked for while live
  std::vector<std::size_t> rounded;    // per slot: rounded size
  std::size_t live_count = 0;
  std::size_t live_bytes = 0;
  std::size_t allocated_bytes = 0;

  bool contains(std::uintptr_t p) const { return p >= base && p < base + size; }
};

// A recorded allocation served by the upstream resource itself.
struct DirectAllocation {
  void* raw = nullptr;        // what the upstream returned
  std::size_t raw_bytes = 0;  // what was asked of the upstream
  std::size_t requested = 0;  // what the caller asked for
};

}  // namespace

void PlannedArenaOptions::validate() const {
  if (replan_after_divergent_steps == 0) {
    throw InvalidArgument("PlannedArenaOptions: replan_after_divergent_steps must be >= 1");
  }
  if (!(planner_time_limit_seconds >= 0.0)) {
    throw InvalidArgument("PlannedArenaOptions: planner_time_limit_seconds must be >= 0");
  }
  fallback.validate();
}

struct PlannedArena::Impl {
  Impl(MemoryResource& up, PlannedArenaOptions opts)
      : upstream(up), options(validated(opts)), pool(up, options.fallback) {}

  static PlannedArenaOptions validated(PlannedArenaOptions opts) {
    opts.validate();
    return opts;
  }

  ~Impl() {
    for (const auto& [ptr, d] : direct_live) {
      upstream.deallocate(d.raw, d.raw_bytes, options.plan_stream);
    }
    release_recording_cache();
    if (current) release(*current);
    for (auto& arena : retired) release(*arena);
  }

  MemoryResource& upstream;
  const PlannedArenaOptions options;
  CachingPool pool;

  mutable std::mutex mutex;
  // The plan: slots and events of the recording, and the arena that serves them.
  std::vector<Slot> slots;
  std::vector<Event> events;
  std::unique_ptr<Arena> current;
  // Arenas of dropped plans that still hold live memory; released when they empty.
  std::vector<std::unique_ptr<Arena>> retired;

  // The step in progress.
  bool in_step = false;
  bool recording = false;  // in_step and no plan: the step is being recorded
  bool divergent = false;  // in a planned step: the step left the plan
  std::size_t cursor = 0;  // next event of the plan the step must match
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
  std::size_t direct_live_bytes = 0;      // requested bytes of direct_live
  std::size_t direct_peak_held_bytes = 0;
  std::size_t direct_peak_live_raw_bytes = 0;
  std::size_t direct_peak_live_bytes = 0;
  std::size_t direct_peak_count = 0;
  std::size_t direct_peak_blocks = 0;    // live and cached
  std::uint64_t direct_allocations = 0;  // requests served
  std::uint64_t direct_frees = 0;
  std::uint64_t upstream_allocations = 0;  // blocks taken from the upstream
  std::uint64_t upstream_releases = 0;
  std::size_t divergent_in_a_row = 0;

  PlannedArenaCounters counters;
  std::size_t arena_peak_live = 0;
  std::size_t arena_peak_allocated = 0;
  std::size_t arena_peak_live_allocations = 0;
  std::size_t arena_peak_segments = 0;
  std::uint64_t arena_allocations = 0;
  std::uint64_t arena_frees = 0;
  std::uint64_t arena_segment_allocations = 0;
  std::uint64_t arena_segment_releases = 0;

  void release(Arena& arena) {
    upstream.deallocate(arena.segment, arena.segment_bytes, options.plan_stream);
    ++arena_segment_releases;
  }

  std::size_t arena_count() const { return (current ? 1 : 0) + retired.size(); }

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

  bool planned_step_active() const { return in_step && !recording && current != nullptr; }

  void* allocate(std::size_t bytes, std::size_t alignment, Stream stream) {
    if (!(stream == options.plan_stream)) {
      void* p = pool.allocate(bytes, alignment, stream);
      if (p != nullptr) count_fallback();
      return p;
    }
    const bool valid = is_power_of_two(alignment) && alignment <= CachingPool::kMaxAlignment &&
                       bytes <= CachingPool::kMaxAllocation;
    if (!valid || bytes == 0) return pool.allocate(bytes, alignment, stream);  // throws or null

    std::lock_guard<std::mutex> lock(mutex);
    const std::size_t rounded = round_up(bytes, kRounding);
    const std::size_t effective_alignment = std::max(alignment, kRounding);
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

  // The upstream guarantees kMinAlignment; a stricter alignment takes slack to align up.
  void* allocate_direct(std::size_t bytes, std::size_t rounded, std::size_t alignment) {
    const std::size_t raw_bytes =
        rounded + (alignment > kMinAlignment ? alignment - kMinAlignment : 0);
    void* raw = nullptr;
    if (const auto cached = recording_cache.find(raw_bytes); cached != recording_cache.end()) {
      raw = cached->second;
      recording_cache.erase(cached);
    } else {
      make_room(raw_bytes);
      try {
        raw = upstream.allocate(raw_bytes, options.plan_stream);
      } catch (const OutOfMemory&) {
        if (recording_cache.empty()) throw;
        release_recording_cache();  // all of it, then once more
        raw = upstream.allocate(raw_bytes, options.plan_stream);
      }
      ++upstream_allocations;
      direct_held_bytes += raw_bytes;
    }
    void* p = reinterpret_cast<void*>(round_up(reinterpret_cast<std::uintptr_t>(raw), alignment));
    try {
      direct_live.emplace(p, DirectAllocation{raw, raw_bytes, bytes});
    } catch (...) {
      release_raw(raw, raw_bytes);
      throw;
    }
    direct_live_raw_bytes += raw_bytes;
    direct_live_bytes += bytes;
    direct_peak_held_bytes = std::max(direct_peak_held_bytes, direct_held_bytes);
    direct_peak_live_raw_bytes = std::max(direct_peak_live_raw_bytes, direct_live_raw_bytes);
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
    upstream.deallocate(raw, raw_bytes, options.plan_stream);
    direct_held_bytes -= raw_bytes;
    ++upstream_releases;
  }

  void release_recording_cache() {
    for (const auto& [raw_bytes, raw] : recording_cache) release_raw(raw, raw_bytes);
    recording_cache.clear();
  }

  // Returns false when ptr is not a direct allocation.
  bool deallocate_direct(void* ptr, std::size_t bytes) {
    const auto it = direct_live.find(ptr);
    if (it == direct_live.end()) return false;
    const DirectAllocation d = it->second;
    if (d.requested != bytes) {
      throw InvalidArgument(name() + ": free of " + std::to_string(bytes) +
                            " bytes, but the allocation was " + std::to_string(d.requested) +
                            " bytes");
    }
    direct_live.erase(it);
    direct_live_raw_bytes -= d.raw_bytes;
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

  void count_fallback() {
    std::lock_guard<std::mutex> lock(mutex);
    ++counters.fallback_allocations;
  }

  void* try_planned(std::size_t bytes, std::size_t rounded, std::size_t alignment) {
    if (cursor >= events.size() || !events[cursor].is_alloc) return nullptr;
    const std::uint32_t k = events[cursor].slot;
    const Slot& slot = slots[k];
    if (slot.rounded != rounded || slot.alignment != alignment) return nullptr;
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
    const auto k = static_cast<std::uint32_t>(slots.size());
    Slot slot;
    slot.rounded = rounded;
    slot.alignment = alignment;
    slot.allocated_at = static_cast<std::int64_t>(events.size());
    slots.push_back(slot);
    events.push_back(Event{true, k});
    recording_live.emplace(p, k);
  }

  void deallocate(void* ptr, std::size_t bytes, Stream stream) {
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
      pool.deallocate(ptr, bytes, stream);  // checks the pointer and the size
      return;
    }
    if (!direct) pool.deallocate(ptr, bytes, stream);
    if (!(in_step && recording)) return;
    auto it = recording_live.find(ptr);
    if (it != recording_live.end()) {
      slots[it->second].freed_at = static_cast<std::int64_t>(events.size());
      events.push_back(Event{false, it->second});
      recording_live.erase(it);
    }
  }

  void free_in_arena(Arena& arena, std::uintptr_t addr, std::size_t bytes, Stream stream,
                     bool is_current) {
    const std::size_t offset = addr - arena.base;
    const auto pos = std::lower_bound(arena.offsets.begin(), arena.offsets.end(), offset);
    const auto index = static_cast<std::size_t>(pos - arena.offsets.begin());
    if (pos == arena.offsets.end() || *pos != offset || arena.occupant[index] == -1) {
      throw InvalidPointer(name() + ": free of a pointer that is not a live allocation (" +
                               "freed already, or inside a planned buffer)",
                           reinterpret_cast<const void*>(addr));
    }
    const auto k = static_cast<std::size_t>(arena.occupant[index]);
    if (arena.requested[k] != bytes) {
      throw InvalidArgument(name() + ": free of " + std::to_string(bytes) +
                            " bytes, but the allocation was " + std::to_string(arena.requested[k]) +
                            " bytes");
    }
    if (is_current && planned_step_active() && !divergent) {
      const bool expected = stream == options.plan_stream && cursor < events.size() &&
                            !events[cursor].is_alloc && events[cursor].slot == k;
      if (expected) {
        ++cursor;
      } else {
        diverge();
      }
    }
    arena.occupant[index] = -1;
    --arena.live_count;
    arena.live_bytes -= arena.requested[k];
    arena.allocated_bytes -= arena.rounded[k];
    arena.requested[k] = 0;
    ++arena_frees;
  }

  void begin_step() {
    std::lock_guard<std::mutex> lock(mutex);
    if (in_step) throw InvalidArgument(name() + ": begin_step() while a step is in progress");
    in_step = true;
    divergent = false;
    cursor = 0;
    recording = current == nullptr;
    if (recording) {
      slots.clear();
      events.clear();
      recording_live.clear();
      return;
    }
    ++counters.planned_steps;
    // Buffers kept from the previous step could overlap this step's slots.
    if (current->live_count != 0) diverge();
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
    if (!divergent && cursor != events.size()) diverge();  // the step stopped early
    if (!divergent) {
      divergent_in_a_row = 0;
      return;
    }
    divergent = false;
    if (++divergent_in_a_row < options.replan_after_divergent_steps) return;
    divergent_in_a_row = 0;
    ++counters.replans;
    drop_plan();
  }

  void drop_plan() {
    if (current) {
      if (current->live_count == 0) {
        release(*current);
      } else {
        retired.push_back(std::move(current));
      }
      current.reset();
    }
    slots.clear();
    events.clear();
  }

  void make_plan() {
    if (slots.empty()) {
      events.clear();
      return;
    }
    std::vector<Buffer> buffers;
    buffers.reserve(slots.size());
    std::size_t max_alignment = kRounding;
    const auto end = static_cast<std::int64_t>(events.size());
    for (std::size_t k = 0; k < slots.size(); ++k) {
      const Slot& s = slots[k];
      buffers.push_back(Buffer{.id = k,
                               .lower = s.allocated_at,
                               .upper = s.freed_at >= 0 ? s.freed_at : end,
                               .size = s.rounded,
                               .alignment = s.alignment});
      max_alignment = std::max(max_alignment, s.alignment);
    }
    PlannerOptions planner_options;
    planner_options.time_limit_seconds = options.planner_time_limit_seconds;
    const PlanResult result = plan(buffers, planner_options);

    auto arena = std::make_unique<Arena>();
    arena->size = static_cast<std::size_t>(result.plan.arena_size);
    // The upstream guarantees kMinAlignment; stricter planned alignments need slack to align
    // the base.
    arena->segment_bytes =
        arena->size + (max_alignment > kMinAlignment ? max_alignment - kMinAlignment : 0);
    // What the fallback pool cached while recording is not needed once the arena serves the
    // step; returning it first keeps the peak at the arena, not arena + cache.
    pool.trim();
    try {
      arena->segment = upstream.allocate(arena->segment_bytes, options.plan_stream);
    } catch (const OutOfMemory&) {
      ++counters.arena_failures;
      slots.clear();
      events.clear();
      return;
    }
    ++arena_segment_allocations;
    if (options.prefault_host_arena && !prefault_host_pages(arena->segment, arena->segment_bytes)) {
      // Only a speed-up: the pages will still be faulted in on first use.
      ++counters.prefault_failures;
    }
    arena->base = round_up(reinterpret_cast<std::uintptr_t>(arena->segment), max_alignment);
    for (std::size_t k = 0; k < slots.size(); ++k) {
      slots[k].offset = static_cast<std::size_t>(result.plan.offsets[k]);
      arena->offsets.push_back(slots[k].offset);
    }
    std::sort(arena->offsets.begin(), arena->offsets.end());
    arena->offsets.erase(std::unique(arena->offsets.begin(), arena->offsets.end()),
                         arena->offsets.end());
    for (Slot& s : slots) {
      s.offset_index = static_cast<std::size_t>(
          std::lower_bound(arena->offsets.begin(), arena->offsets.end(), s.offset) -
          arena->offsets.begin());
      arena->rounded.push_back(s.rounded);
    }
    arena->occupant.assign(arena->offsets.size(), -1);
    arena->requested.assign(slots.size(), 0);
    current = std::move(arena);
    arena_peak_segments = std::max(arena_peak_segments, arena_count());
  }

  PoolStats stats() const {
    PoolStats s = pool.stats();
    std::lock_guard<std::mutex> lock(mutex);
    const std::size_t live = sum_arenas([](const Arena& a) { return a.live_bytes; });
    const std::size_t allocated = sum_arenas([](const Arena& a) { return a.allocated_bytes; });
    const std::size_t reserved = sum_arenas([](const Arena& a) { return a.segment_bytes; });
    const std::size_t count = sum_arenas([](const Arena& a) { return a.live_count; });
    s.live_bytes += live + direct_live_bytes;
    s.peak_live_bytes += direct_peak_live_bytes;
    s.allocated_bytes += direct_live_raw_bytes;
    s.peak_allocated_bytes += direct_peak_live_raw_bytes;
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

void PlannedArena::begin_step() { impl_->begin_step(); }
void PlannedArena::end_step() { impl_->end_step(); }

bool PlannedArena::has_plan() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->current != nullptr;
}

std::size_t PlannedArena::planned_arena_size() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->current ? impl_->current->size : 0;
}

std::size_t PlannedArena::planned_events() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->current ? impl_->events.size() : 0;
}

PoolStats PlannedArena::stats() const { return impl_->stats(); }

PlannedArenaCounters PlannedArena::counters() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->counters;
}

CachingPool& PlannedArena::fallback_pool() { return impl_->pool; }

std::string PlannedArena::name() const { return impl_->name(); }

std::size_t PlannedArena::capacity() const { return impl_->upstream.capacity(); }

}  // namespace sdalloc
