// policies/planned_arena/free_routing.cpp - PlannedArena's frees and sizes: a pointer is
// freed where it lives (an arena, the recording's blocks or the fallback pool), a free in
// the arena is matched against the plan's next event, and record_stream and
// allocation_size find the same owner (impl.hpp).
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/bits.hpp"
#include "policies/planned_arena/impl.hpp"
#include "sdalloc/core/errors.hpp"

namespace sdalloc {

using planned_arena_detail::Event;
using planned_arena_detail::kRounding;

void PlannedArena::Impl::check_size(std::optional<std::size_t> bytes, std::size_t requested) const {
  if (bytes && *bytes != requested) {
    throw InvalidArgument(name() + ": free of " + std::to_string(*bytes) +
                          " bytes, but the allocation was " + std::to_string(requested) + " bytes");
  }
}

void PlannedArena::Impl::deallocate(void* ptr, std::optional<std::size_t> bytes, Stream stream) {
  if (ptr == nullptr) return;
  const std::size_t freed = route_free(ptr, bytes, stream);
  live.sub(freed, round_up(freed, kRounding));
}

std::size_t PlannedArena::Impl::route_free(void* ptr, std::optional<std::size_t> bytes,
                                           Stream stream) {
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

std::size_t PlannedArena::Impl::pool_free(void* ptr, std::optional<std::size_t> bytes,
                                          Stream stream) {
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

std::size_t PlannedArena::Impl::free_in_arena(Arena& arena, bool is_current, std::uintptr_t addr,
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

std::optional<std::size_t> PlannedArena::Impl::free_recording_block(
    void* ptr, std::optional<std::size_t> bytes) {
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

void PlannedArena::Impl::record_stream(void* ptr, Stream stream) {
  std::unique_lock<std::mutex> lock(mutex);
  if (requested_size_here(ptr)) {
    users.add(ptr, stream);
    return;
  }
  lock.unlock();
  pool.record_stream(ptr, stream);  // throws InvalidPointer for anything else
}

std::optional<std::size_t> PlannedArena::Impl::requested_size_here(const void* ptr) const {
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

std::size_t PlannedArena::Impl::allocation_size(const void* ptr) const {
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (const auto size = requested_size_here(ptr)) return *size;
  }
  return pool.allocation_size(ptr);
}

}  // namespace sdalloc
