// policies/planned_arena/arena.hpp - the arena the plans share: reserving, prefaulting,
// growing, retiring and trimming it, and which planned buffer occupies which offset.
//
// Arena is one reservation from the upstream and its occupancy: the plan whose buffers it
// holds, and per offset of that plan the slot live there. SharedArena owns the current
// arena - as large and as strictly aligned as the largest plan needs; steps never overlap,
// so all plans share it - and the retired ones: arenas replaced (grown) or dropped with
// the last plan while buffers in them were still live, released as soon as they empty.
//
// Invariants:
//  - While a step follows its plan, at most one live buffer starts at any offset; a free
//    finds its slot by binary search over the plan's offsets, so the hot path allocates no
//    memory. Arena memory is handed out only at base + a planned offset.
//  - An arena's memory is reserved (segment != nullptr) or not; the current one is not
//    reserved only after trim() between steps or when a growth released it, and
//    reserve_again() at the next step takes it back.
//  - Memory freed for other streams (record_stream, a free on another stream) is reused,
//    and arena memory released, only after wait_for_users(): begin_step and every release
//    wait for the events noted with add_users().
//  - An arena taken from the upstream is reserved only after the fallback pool's cache went
//    back, so the upstream holds the arena, not arena + cache. An arena taken from the pool
//    (from_pool) is one of its allocations: the pool serves it from the pages it has. The
//    destructor waits and releases every arena.
// Not thread-safe: PlannedArena's mutex guards it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "policies/planned_arena/figures.hpp"
#include "policies/planned_arena/step_plan.hpp"
#include "sdalloc/core/pool_layout.hpp"
#include "sdalloc/core/resource.hpp"
#include "sdalloc/core/stream.hpp"
#include "sdalloc/core/stream_events.hpp"
#include "sdalloc/policies/any_pool.hpp"

namespace sdalloc::planned_arena_detail {

class Arena {
 public:
  // `aligned_source`: what the memory comes from honours `alignment` itself (a pool), so the
  // reservation needs no slack to align its base.
  Arena(Stream stream, std::size_t size, std::size_t alignment, bool aligned_source = false);

  bool reserved() const { return segment_ != nullptr; }
  bool contains(std::uintptr_t p) const { return reserved() && p >= base_ && p < base_ + size_; }
  Stream stream() const { return stream_; }
  std::size_t size() const { return size_; }
  std::size_t alignment() const { return alignment_; }
  std::size_t segment_bytes() const { return segment_bytes_; }
  std::size_t live_count() const { return live_count_; }
  std::size_t live_bytes() const { return live_bytes_; }
  std::size_t allocated_bytes() const { return allocated_bytes_; }

  // Makes `plan` the one whose buffers the arena holds (it must be empty).
  void occupy(std::shared_ptr<const StepPlan> plan);
  // Slot k of the occupying plan, `bytes` asked for: its address, or nullptr when another
  // buffer is live at its offset (cannot happen while a step follows its recording;
  // checked so that a bug shows as a fallback, never as two live buffers at one address).
  void* place(std::size_t k, std::size_t bytes);
  // The slot whose live buffer starts at p, or -1; *index is its offset's index.
  std::int64_t live_slot_at(std::uintptr_t p, std::size_t* index) const;
  // The bytes asked for by live slot k.
  std::size_t requested(std::size_t k) const { return requested_[k]; }
  // Frees live slot k at offset index `index`.
  void vacate(std::size_t index, std::size_t k);

  // The arena as one segment: its live buffers as blocks, the rest free.
  void add_layout(PoolLayout& layout) const;
  // Its live buffers and the free space between them, in address order, from its start up
  // to `end` (its end, or past it).
  void add_blocks(std::vector<BlockLayout>& blocks, std::uintptr_t end) const;
  // Live count and bytes agree with the occupants, every occupant is a slot of the plan
  // inside the arena, and live buffers only in reserved memory; throws Error otherwise.
  void check_invariants() const;

 private:
  friend class SharedArena;  // reserves and releases the memory

  void* segment_ = nullptr;        // null while not reserved (the plans stay)
  Stream stream_;                  // the plan stream: arena memory is reused there at once
  std::size_t size_ = 0;           // the largest plan's size
  std::size_t alignment_ = 0;      // the strictest planned alignment: base_'s
  std::size_t segment_bytes_ = 0;  // size_ and the slack to align the base
  std::uintptr_t base_ = 0;
  std::shared_ptr<const StepPlan> plan_;  // whose buffers occupy it (kept alive while they do)
  std::vector<std::int64_t> occupant_;    // per plan offset: live slot or -1
  std::vector<std::size_t> requested_;    // per plan slot: bytes asked for while live
  std::size_t live_count_ = 0;
  std::size_t live_bytes_ = 0;
  std::size_t allocated_bytes_ = 0;
};

class SharedArena {
 public:
  // `pool` is the fallback pool. from_pool: each arena is one allocation of the pool
  // (PlannedArenaOptions::arena_from_fallback); otherwise it is taken from `upstream`, and
  // the pool is trimmed before each reservation. prefault: fault the pages of each arena
  // taken from the upstream in (PlannedArenaOptions::prefault_host_arena).
  SharedArena(MemoryResource& upstream, AnyPool& pool, StreamEvents& events, bool prefault,
              bool from_pool = false)
      : upstream_(upstream),
        pool_(pool),
        events_(events),
        prefault_(prefault),
        from_pool_(from_pool) {}
  ~SharedArena();
  SharedArena(const SharedArena&) = delete;
  SharedArena& operator=(const SharedArena&) = delete;

  // The arena the plans share; nullptr without plans.
  Arena* current() const { return current_.get(); }
  // The arenas are allocations of the fallback pool (counted in its figures).
  bool from_pool() const { return from_pool_; }
  // Bytes the largest plan needs (0 without an arena).
  std::size_t size() const { return current_ ? current_->size() : 0; }
  // The current arena is as large and as strictly aligned as `plan` needs.
  bool holds(const StepPlan& plan) const;
  // Replaces the current arena by one on `stream` that fits `plan` as well as every plan it
  // served. False (counted) when the upstream refuses it; the old arena then stays, unless
  // `no_plans_left`, when it is retired.
  bool grow_for(const StepPlan& plan, Stream stream, bool no_plans_left);
  // Reserves the current arena again after trim(); false (counted) when refused. True when
  // there is nothing to reserve.
  bool reserve_again();
  // The current arena goes: released now when empty, else kept until its buffers are freed.
  void retire();
  // Between steps: releases the current arena when none of its memory is live; the bytes.
  std::size_t trim();

  // The reserved arena (current or retired) that contains addr, or nullptr.
  Arena* find(std::uintptr_t addr, bool* is_current) const;
  // Places slot k of the plan occupying the current arena; nullptr as Arena::place.
  void* place(std::size_t k, std::size_t bytes);
  // Frees live slot k of `arena`; a retired arena that empties is released.
  void vacate(Arena& arena, std::size_t index, std::size_t k);

  // Events of other streams' work on freed arena memory, waited for before it is reused.
  void add_users(const std::vector<StreamEvents::Event>& events);
  void wait_for_users();

  ArenaFigures figures() const;
  // Each arena as a segment of its own; arenas of the pool (from_pool) replace the block
  // that is each of them in the pool's `layout` by their own blocks.
  void add_layout(PoolLayout& layout) const;
  // Every arena's check_invariants().
  void check_invariants() const;

 private:
  bool reserve(Arena& arena);
  void release(Arena& arena);
  static void splice(const Arena& arena, PoolLayout& layout);
  std::size_t reserved_count() const;
  template <typename F>
  std::size_t sum(F figure) const;

  MemoryResource& upstream_;
  AnyPool& pool_;
  StreamEvents& events_;
  const bool prefault_;
  const bool from_pool_;
  std::unique_ptr<Arena> current_;
  std::vector<std::unique_ptr<Arena>> retired_;
  std::vector<StreamEvents::Event> waits_;
  ArenaFigures figures_;  // current values: see figures()
};

}  // namespace sdalloc::planned_arena_detail
