// tools/sdalloc/replay/replay_driver.hpp - `sdalloc replay`'s measurements, without the command
// line.
//
// run_replay() replays one trace through each requested allocator - sdalloc's in this
// process (replay_target.hpp), the system ones in child processes (system_allocators.hpp) -
// `passes` times, and collects per allocator: peak bytes held, the ratio to the trace's
// peak live bytes, the median time per event, the samples for the plot and, with
// min_capacity, the least capacity the allocator needs (bisection with a capacity cap;
// sdalloc's allocators only: a system allocator cannot be capped).
// An allocator that cannot run (missing library, out of memory under --capacity) gets a
// result with ran = false and the reason; the others still run.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "replay/prepared_trace.hpp"
#include "replay/replay_result.hpp"
#include "replay/replay_target.hpp"
#include "sdalloc/trace/event_trace.hpp"

namespace sdalloc::replay {

struct ReplayOptions {
  std::vector<std::string> allocators;  // names (allocator_names()); empty: every one
  int passes = 3;
  std::uint64_t capacity = 0;  // 0: none; else sdalloc's allocators may hold at most this
  bool min_capacity = false;
  bool touch = false;
  bool progress = true;   // progress lines on stderr for work longer than a second
  TargetSettings target;  // its capacity is set from `capacity`
};

// Every name --allocator accepts, in table order.
std::vector<std::string> allocator_names();

// Throws InvalidArgument for an unknown allocator name (listing the known ones) or passes
// < 1, before replaying anything.
ReplayRun run_replay(const EventTrace& trace, const ReplayOptions& options);

// The least capacity (within max(4 KiB, peak live / 4000)) at which `allocator` replays
// the trace `passes` times without running out of memory; nullopt when even 4 x its
// uncapped peak is not enough. Exposed for tests.
std::optional<std::uint64_t> find_min_capacity(const InProcessAllocator& allocator,
                                               const PreparedTrace& trace, int passes,
                                               const TargetSettings& settings,
                                               std::uint64_t uncapped_peak, bool progress);

}  // namespace sdalloc::replay
