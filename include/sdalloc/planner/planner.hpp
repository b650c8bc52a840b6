// sdalloc/planner/planner.hpp - static memory planning: give every buffer of a known schedule an
// offset in one arena.
//
// A Buffer lives in the half-open time interval [lower, upper) and needs `size` bytes at an
// offset that is a multiple of `alignment`. Two buffers conflict when their lifetimes
// intersect (a.lower < b.upper && b.lower < a.upper: one ending at t and one starting at t
// may share memory); conflicting buffers must not overlap in [offset, offset + size).
// A Plan gives each buffer (same index as the input) its offset; arena_size is the highest
// offset + size, the bytes the arena must have.
//
// plan() runs the published heuristics (greedy by size as TFLite's arena planner, by
// lifetime and by area, and best fit as XLA's heap simulator) and then a MiniMalloc-style
// search (Moffitt, ASPLOS 2023) over "canonical" solutions - each buffer at the lowest
// offset its already placed neighbours allow, placed in non-decreasing offset order - with
// pruning by per-section lower bounds. It respects a time budget from its first step (even
// the first greedy placement stops when it runs out, looking every 1024 buffers; only the
// O(n log n) checks, sorts and the final validation are not cut) and always returns the
// best plan found, validated. Greedy placement finds each buffer's placed conflicts in an
// interval index, O((log n + k) log k) for k conflicts, so 10^6 short-lived buffers plan in
// about a second of CPU time. With a capacity it looks for a plan that fits and stops as
// soon as it has one; without, it minimises the arena: a search within lower_bound() first,
// then a bisection and short probes just below the best plan (docs/planner.md), stopping
// at the bound (or within accept_within of it), the time limit or the search's own limit.
//
// Errors: malformed input (upper <= lower, a time outside [-kMaxTime, kMaxTime], size 0,
// alignment not a power of two, duplicate ids) is an InvalidArgument naming the buffer; so
// are sizes whose sums pass 2^64 - 1 (buffers live together, or a placement's end): all
// offset arithmetic is checked, none wraps. A negative (or NaN) time limit, search time
// limit or accept_within is an InvalidArgument too. validate() throws InvalidArgument naming the
// two conflicting buffer ids. Everything here is pure computation and thread-compatible.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <span>
#include <string>
#include <vector>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/trace/event_trace.hpp"

namespace sdalloc {

// Times lie in [-kMaxTime, kMaxTime], so any difference of two fits an int64.
inline constexpr std::int64_t kMaxTime = std::int64_t{1} << 62;
// Longer time limits are taken as this one (about 31 years: no limit, in practice).
inline constexpr double kMaxTimeLimitSeconds = 1e9;

struct Buffer {
  std::uint64_t id;
  std::int64_t lower;  // first time unit the buffer is live
  std::int64_t upper;  // first time unit it is no longer live (exclusive)
  std::uint64_t size;
  std::uint64_t alignment = 1;  // power of two
};

struct Plan {
  std::vector<std::uint64_t> offsets;  // one per buffer, same order as the input
  std::uint64_t arena_size = 0;        // max over buffers of offset + size (0 when empty)
};

// The orders the greedy placement can take buffers in. Each places a buffer at the lowest
// aligned offset (or, for kBestFit, the tightest gap) free of the time-conflicting buffers
// placed before it.
enum class GreedyOrder : std::uint8_t {
  kSize,      // largest first (TFLite's arena planner)
  kLifetime,  // longest lifetime first
  kArea,      // largest size * lifetime first
  kBestFit,   // largest first, into the smallest gap that holds it (XLA's heap simulator)
};

struct PlanProgress {
  double seconds;            // since plan() started
  std::uint64_t best_arena;  // best plan so far
  std::uint64_t lower_bound;
  std::uint64_t nodes;  // search nodes visited
  // The capacity the search is looking for a plan within now: the one asked for or,
  // without, the arena being probed (the lower bound first, then bisection targets).
  std::uint64_t probing = 0;
};

struct PlannerOptions {
  std::uint64_t capacity = 0;        // 0: no limit, minimise; else look for a plan within it
  double time_limit_seconds = 10.0;  // >= 0; above kMaxTimeLimitSeconds, that
  bool use_heuristics = true;        // run the greedy orders first
  bool use_search = true;            // then the canonical search
  // A plan within this fraction above the lower bound is good enough: the search stops (or
  // never starts) once it has one, as it does at the bound itself. 0: only the bound (or the
  // capacity). A caller that plans at run time (PlannedArena) takes a plan a few parts in
  // ten thousand above the bound at once rather than search seconds for the last bytes.
  double accept_within = 0.0;
  // Seconds the search may take once the greedy placements are done (the time limit still
  // holds; above kMaxTimeLimitSeconds: that). The greedy plans are never cut by it, so a
  // small value still gives a complete plan: PlannedArena bounds its search by a share of
  // the step it plans.
  double search_time_limit_seconds = kMaxTimeLimitSeconds;
  // 0: no limit; else the search stops after visiting this many nodes in all, as it does at
  // the time limit. Unlike the clock it gives the same plan on every machine and every run
  // (the fuzzers and tests that need one answer use it); the time limit still holds.
  std::uint64_t max_search_nodes = 0;
  // Threads for the search's probes while minimising (no capacity): 1 runs them in turn on
  // the calling thread; more run sweeps below the best plan beside the bisection, so the
  // same time limit gives more search (docs/planner.md); 0: one per hardware thread. At most
  // kMaxThreads. With more than one, the plan found may differ from run to run, as the time
  // each probe gets does; with a node limit the search runs on one thread whatever this says.
  unsigned threads = 1;
  static constexpr unsigned kMaxThreads = 64;
  // Called about once a second while the search runs (nullptr: never); with several
  // threads, from whichever is searching, one call at a time.
  std::function<void(const PlanProgress&)> progress = nullptr;
};

struct PlanResult {
  Plan plan;
  std::uint64_t lower_bound = 0;
  bool fits = false;       // plan.arena_size <= capacity (always true without a capacity)
  bool optimal = false;    // the arena equals the lower bound, or the search proved minimality
  bool timed_out = false;  // the time limit (or max_search_nodes) ended the search
  // The time ran out before even greedy by size had placed every buffer: those left were
  // stacked one over another above the rest. Valid, but a poor plan (timed_out is set).
  bool cut_short = false;
  std::string method;  // what found the plan returned: "greedy-size", "search", ...
  double seconds = 0.0;
  std::uint64_t search_nodes = 0;
};

// Throws InvalidArgument on malformed buffers (see above).
void check_buffers(std::span<const Buffer> buffers);
// Max over time of the sum of sizes of the buffers live then: no plan can be smaller.
// Throws InvalidArgument when that sum passes 2^64 - 1 (no plan exists).
std::uint64_t lower_bound(std::span<const Buffer> buffers);
// Throws InvalidArgument if the plan has the wrong length, an offset is misaligned,
// arena_size is not max(offset + size), an offset + size passes 2^64 - 1, or two
// conflicting buffers overlap in space (the
// message names both ids). O(n log n + conflicts checked) sweep.
void validate(std::span<const Buffer> buffers, const Plan& plan);

// One greedy placement in the given order.
Plan plan_greedy(std::span<const Buffer> buffers, GreedyOrder order);
// The heuristics, then the search, within options' time limit; the result is validated.
PlanResult plan(std::span<const Buffer> buffers, const PlannerOptions& options = {});

// Interval problems on disk. MiniMalloc's CSV: header `id,lower,upper,size` (an optional
// fifth column `offset` is ignored), one buffer per line; errors are InvalidArgument
// "<source>:<line>: <what is wrong>".
std::vector<Buffer> parse_interval_csv(std::istream& in, const std::string& source_name);
std::vector<Buffer> read_interval_csv(const std::string& path);
// Writes `id,lower,upper,size,offset`.
void write_plan_csv(std::span<const Buffer> buffers, const Plan& plan, std::ostream& out);
// An event trace as intervals, time = event index: an allocation at event i freed at event
// j lives in [i, j); one never freed lives until the end of the trace (events.size()).
std::vector<Buffer> buffers_from_trace(const EventTrace& trace);

}  // namespace sdalloc
