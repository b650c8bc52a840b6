// sdalloc/policies/planned_arena.hpp - an allocator that replays a planned iteration from one
// arena.
//
// Inference loops (the denoising steps of a diffusion sampler) make the same allocations in the
// same order every iteration. PlannedArena records that order once, plans every buffer an
// offset in one arena with sdalloc::plan() (planner.hpp), and then serves later iterations
// from the arena by position: the k-th allocation of a step gets arena + offset[k]. No
// search, no splitting, no merging, and the arena is as small as the planner can make it.
//
// Steps are marked by the caller: begin_step() ... end_step().
//  - Without a plan, a step is recorded: its (rounded size, alignment) and the order of
//    allocations and frees are noted. Where its memory comes from depends on the options:
//     * arena_from_fallback (make_pool sets it where memory is virtual): the fallback pool,
//       a VirtualMemoryPool, serves the recording, and each arena is one allocation of that
//       pool. The recording's freed pages move under the arena, and an arena given up for
//       a new recording gives its pages to it, so no page is created (or faulted in) twice,
//       and the recording holds what the pool needs for its live blocks: at most the larger
//       of its own live peak and the arena it replaces, beside what is live elsewhere.
//     * record_through_upstream (the default otherwise): recorded allocations are blocks of
//       the upstream resource itself; a freed one is cached for a later request of exactly
//       its size, and cached blocks go back to the upstream before it is asked for more than
//       the step has had live at once; what the fallback pool caches and an arena with
//       nothing live in it go back when the recording starts. So the recording step never
//       holds more than its own peak of live bytes (page rounding aside) beside what is live
//       elsewhere, but every block is new memory (on the host, pages faulted in again).
//     * neither: the fallback CachingPool serves the recording (faster, more memory held).
//    end_step() plans the recording (within the limits below), reserves ONE arena of the
//    plan's size (or a larger one in place of the arena the other plans share, see below),
//    from the fallback pool or from the upstream (then after the fallback pool's cache went
//    back), and later steps are served from it. An arena the recording gave back is taken
//    again there too, so the steps that follow call the memory no more than later ones. A
//    step with no allocations for the arena plans nothing.
//  - Planning time: a plan within plan_within of the least arena the recording allows is
//    taken at once; otherwise the planner searches for a smaller one for at most
//    planner_share_of_step of the recorded step's own duration (and
//    planner_time_limit_seconds in all), so planning adds at most that share to the first
//    step (docs/planned_arena.md).
//  - A recording too long to plan within planner_time_limit_seconds (the planner ran out of
//    time before its first greedy plan was complete) makes no plan: end_step() returns after
//    about that long, and the step counts in unplanned_steps. A later recording that grows
//    to as many events is given up there (the rest of its step goes to the fallback pool),
//    so no end_step() waits for a plan it will not get.
//  - Kept buffers: an allocation still live at the recording's end_step() is the loop's
//    carried state (the next step's latents, freed during the next step). The plan serves
//    it, in later steps, from the fallback pool (counted in kept_allocations), not from the
//    arena: so every step begins with the arena empty, and its free - whenever it comes -
//    is not an event of the plan.
//  - Several kinds of step (other image or batch sizes): the first plan-stream allocation of
//    a step picks the plan that begins with the same request (the most recently followed,
//    if several do). A step that matches none is recorded as a new plan while fewer than
//    `max_plans` exist; otherwise it is divergent. The plans share one arena, as large as
//    the largest needs: steps never overlap, and every step begins with the arena empty.
//    Kinds of step that begin with the same request share one plan; the other kind diverges
//    from it, and replaces it once it has diverged replan_after_divergent_steps in a row.
//  - In a planned step, the step follows the plan while each allocation and each free of an
//    arena pointer is exactly the next event of the recording (an allocation: same size
//    after rounding to CachingPool::kRounding and same alignment; a free: the buffer the
//    recording freed at that position). The first event that differs - a new size, an extra
//    allocation, a free in another order, a free on another stream than the plan stream -
//    makes the step divergent: that request and every later allocation of the step go to the
//    fallback pool. A step that ends before the recording did is divergent too. Nothing fails.
//  - A step that begins while arena memory is still live (a buffer kept across end_step) is
//    divergent from its start, since its slots could overlap memory in use.
//  - After `replan_after_divergent_steps` divergent steps in a row a plan is dropped: the
//    plan those steps picked, or, for steps that matched none, the least recently followed
//    one; a later step is recorded again. The arena goes back (to the upstream, or to the
//    fallback pool it came from) with the last plan, as soon as none of its memory is live.
// Allocations outside a step go to the fallback pool and are not recorded.
//
// Memory the caller gives back: free(ptr, stream) needs no byte count (the C API and the
// PyTorch shim free that way); trim() returns the fallback pool's cache and, between steps,
// the arena itself when none of its memory is live - the plan stays, and the next
// begin_step() reserves the arena again (an inference pipeline can hand the denoiser's
// arena to its next stage, as torch.cuda.empty_cache() hands over a cache).
//
// Why this is safe: while a step follows the recording event for event, the set of live
// arena buffers is exactly the set the recording had live at that position, and the plan
// gives buffers whose lifetimes intersect disjoint bytes. So a slot is never handed out while
// its previous occupant is live. Once a step diverges no arena memory is handed out until the
// next step, which starts with the arena empty.
//
// Streams: the plans are sequences of one stream: options.plan_stream, or the stream given to
// begin_step(stream) when the first plan is recorded. Requests on any other stream go
// straight to the fallback pool and are neither recorded nor checked; a step begun on
// another stream than the plans' is divergent (matching none). Arena memory is reused at once on
// the plan stream. Memory also used by other streams - freed on another stream, or named in
// record_stream() - makes its step divergent, and its slot is not reused before those streams'
// work, as of the free, has completed (options.fallback.stream_events; begin_step() waits for it).
//
// Thread-safety: all members may be called concurrently. One mutex guards the recording, the
// plans and the arena's bookkeeping; plan-stream requests and every free take it. Requests on
// other streams only take the fallback pool's own locks.
//
// Errors (leave the object unchanged and usable): zero bytes -> nullptr; sizes and
// alignments as CachingPool (OutOfMemory above kMaxAllocation, InvalidArgument for a bad
// alignment); a free of a pointer that is not live here -> InvalidPointer; a free with
// another byte count -> InvalidArgument; begin_step() inside a step or end_step() outside
// one -> InvalidArgument; record_stream() or allocation_size() of a pointer that is not
// live here -> InvalidPointer. If the arena cannot be reserved (OutOfMemory, or another
// Error of the memory it comes from, such as a failed map the pool rolled back) for a new
// plan at end_step(), that plan is discarded; when it cannot be taken again
// (at begin_step() after a trim, or at the end of a recording that gave it back), every
// plan is. Both are counted in arena_failures, and a later step records.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "sdalloc/core/pool.hpp"
#include "sdalloc/core/pool_layout.hpp"
#include "sdalloc/core/pool_stats.hpp"
#include "sdalloc/core/resource.hpp"
#include "sdalloc/core/stream.hpp"
#include "sdalloc/policies/caching_pool.hpp"

namespace sdalloc {

class AnyPool;

struct PlannedArenaOptions {
  std::size_t replan_after_divergent_steps = 3;  // divergent steps in a row that drop a plan
  std::size_t max_plans = 4;                     // plans kept at once (steps of other shapes)
  Stream plan_stream = kDefaultStream;           // the stream whose sequence is planned
  double planner_time_limit_seconds = 1.0;       // per plan, spent inside end_step()
  // The planner's search (after its greedy plans, which always complete within the limit
  // above) may take at most this share of the recorded step's own duration: planning adds
  // at most that much to the step that records. Not applied under planner_max_search_nodes.
  double planner_share_of_step = 0.25;
  // A plan within this fraction above the least arena the recording allows is taken at once
  // (PlannerOptions::accept_within): no search for the last few hundred bytes.
  double plan_within = 1.0 / 4096;
  // Also stop the planner's search after this many nodes (0: only the time limit): the same
  // plan on every machine, e.g. for tests and fuzzers (PlannerOptions::max_search_nodes).
  std::uint64_t planner_max_search_nodes = 0;
  // The fallback pool's options (its stream_events are also the arena's).
  CachingPoolOptions fallback = {};
  // Serve the recording step's plan-stream allocations straight from the upstream, so the
  // step being recorded does not hold a pool's cache beside what is live. Off: the
  // fallback pool serves them (faster recording, more memory held while recording).
  bool record_through_upstream = true;
  // Fault the arena's pages in when it is reserved (prefault_host_pages), so the first
  // planned step does not pay a page fault per 4 KiB. Only for an upstream that hands out
  // host memory (HostResource, or adaptors over it); the cost moves into end_step().
  bool prefault_host_arena = false;
  // Take each arena from the fallback pool, as one allocation, instead of from the upstream,
  // and serve the recording step from the fallback pool (record_through_upstream is then
  // not used). For a fallback that moves pages (VirtualMemoryPool: make_pool builds one
  // where memory is virtual): the recording's freed pages move under the arena, and an
  // arena given up for a new recording gives its pages to it, so no page is created, nor
  // faulted in, twice, and once a shape is planned its steps make no call to the memory.
  bool arena_from_fallback = false;

  // Throws InvalidArgument for replan_after_divergent_steps == 0, max_plans == 0, a
  // negative time limit, share or plan_within, or bad fallback options.
  void validate() const;
};

struct PlannedArenaCounters {
  std::uint64_t planned_allocations = 0;   // served from an arena
  std::uint64_t kept_allocations = 0;      // planned, but kept past the step: fallback pool
  std::uint64_t fallback_allocations = 0;  // served by the fallback pool (all streams), but
                                           // not the recording's own allocations
  std::uint64_t recorded_allocations = 0;  // allocations of recorded steps (any source)
  std::uint64_t recorded_steps = 0;        // steps recorded (each produced a plan or nothing)
  std::uint64_t planned_steps = 0;         // steps begun with a plan
  std::uint64_t divergent_steps = 0;       // planned steps that diverged
  std::uint64_t replans = 0;               // plans dropped after too many divergent steps
  std::uint64_t arena_failures = 0;        // plans discarded because the arena was refused
  std::uint64_t prefault_failures = 0;     // arenas whose pages could not be faulted in
  std::uint64_t unplanned_steps = 0;       // recordings given up as too long to plan in time
};

class PlannedArena final : public MemoryResource, public PoolLimits {
 public:
  // Makes the fallback pool over `upstream` (the arena's own counting view of the upstream:
  // what the fallback takes is counted with the arena's memory) with `options.fallback`.
  using FallbackMaker =
      std::function<std::unique_ptr<AnyPool>(MemoryResource& upstream, const CachingPoolOptions&)>;

  // The upstream resource must outlive this object. The fallback pool is a CachingPool, or
  // what `make_fallback` makes (the pool factory, make_pool, passes its own).
  explicit PlannedArena(MemoryResource& upstream, PlannedArenaOptions options = {});
  PlannedArena(MemoryResource& upstream, PlannedArenaOptions options,
               const FallbackMaker& make_fallback);
  ~PlannedArena() override;

  using MemoryResource::allocate;
  // Like allocate(bytes, stream) with a stricter alignment (rules as CachingPool).
  void* allocate(std::size_t bytes, std::size_t alignment, Stream stream);

  // Frees without the byte count (rules and errors as deallocate otherwise).
  void free(void* ptr, Stream stream = kDefaultStream);
  // The byte count asked for by the live allocation ptr; InvalidPointer otherwise.
  std::size_t allocation_size(const void* ptr) const;
  // Declares that work on `stream` also uses the live allocation ptr (PyTorch's
  // record_stream); see Streams above.
  void record_stream(void* ptr, Stream stream);

  // begin_step() keeps the plan stream; begin_step(stream) records on `stream` when no plan
  // exists, and is divergent when the plan belongs to another stream.
  void begin_step();
  void begin_step(Stream stream);
  void end_step();
  bool in_step() const;
  Stream plan_stream() const;

  bool has_plan() const;
  std::size_t plan_count() const;
  // Bytes the largest plan needs: the shared arena (0 without a plan); the memory reserved
  // may be slightly larger to align its base.
  std::size_t planned_arena_size() const;
  // Events (allocations and frees) in the most recently followed plan's recording.
  std::size_t planned_events() const;

  // Arena, fallback pool and a recording's blocks together: reserved includes the
  // arena(s); current figures are exact, and so are the peaks (what was reserved, live or
  // allocated at once, and the most ranges held from the upstream at once: allocated counts
  // requests rounded to 512 bytes, or the current figure when that is more).
  PoolStats stats() const;
  void reset_peak();
  // Bytes given back to the upstream, or by the fallback pool to its memory (see "Memory
  // the caller gives back" above).
  std::size_t trim();
  // The fallback pool's segments, each arena as one segment (its live buffers as blocks,
  // the rest free; an arena of the fallback pool in place of the pool's block that holds
  // it), and each direct block of a recording as a segment of its own.
  PoolLayout layout() const;
  PlannedArenaCounters counters() const;
  AnyPool& fallback_pool();
  // Checks the fallback pool's invariants and the arena's and the recording's books (live
  // counts and bytes agree with the buffers, every buffer inside its arena, no more plans
  // than max_plans). Throws Error naming the first broken one; for tests and debugging.
  void check_invariants() const;

  std::string name() const override;
  std::size_t capacity() const override;

  struct Impl;

 private:
  void* do_allocate(std::size_t bytes, Stream stream) override;
  void do_deallocate(void* ptr, std::size_t bytes, Stream stream) override;

  std::unique_ptr<Impl> impl_;
};

}  // namespace sdalloc
