// tools/sdalloc/replay/replay_result.hpp - what one `sdalloc replay` run measured.
//
// The replay driver fills a ReplayRun (one trace, every allocator it ran); the table, the
// JSON file and the HTML report are three renderings of it. Nothing here measures anything.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace sdalloc::replay {

// Bytes at one point of the replay. `event` counts events from the start of the first pass
// (pass p, event i of a trace of n events: p * n + i), so several passes plot side by side.
struct Sample {
  std::uint64_t event = 0;
  std::uint64_t live_bytes = 0;      // the most the trace had live since the previous sample
  std::uint64_t reserved_bytes = 0;  // what the allocator held then (RSS growth for system ones)
};

struct AllocatorResult {
  std::string allocator;    // "pool", "planned", "vmm", "glibc", "jemalloc", ...
  std::string description;  // one line: what it is, e.g. "CachingPool over HostResource"
  // false when the allocator could not run (library missing, out of memory, ...); then
  // `problem` says why and how to fix it, and the figures below are meaningless.
  bool ran = false;
  std::string problem;
  // Did not run because something failed: an error other than running out of memory, a
  // child process that crashed. Not set for an allocator that is not installed or not
  // measured (sanitizer build), nor for out of memory. `sdalloc replay` then exits with 4.
  bool failed = false;
  std::uint64_t peak_reserved = 0;   // most bytes held at once over all passes
  double ratio = 0;                  // peak_reserved / the trace's peak live bytes
  double ns_per_op = 0;              // median over passes of (pass time / events)
  std::vector<double> pass_seconds;  // wall-clock time of each pass
  // sdalloc's and the PyTorch models' calls to the memory under them in each pass
  // (ReplayTarget::memory_calls); empty for the system allocators.
  std::vector<std::uint64_t> pass_memory_calls;
  std::optional<std::uint64_t> min_capacity;  // --min-capacity: least capacity without OOM
  std::string counters;                       // free text for the table, e.g. "syscalls 12, maps 3"
  std::vector<Sample> samples;                // in event order, a few hundred per pass
};

struct ReplayRun {
  std::string trace;              // the trace's source (path, "-" for stdin)
  std::uint64_t events = 0;       // events in one pass
  std::uint64_t allocations = 0;  // allocations in one pass
  std::uint64_t peak_live = 0;    // the trace's peak live bytes: the lower bound
  int passes = 1;
  bool touch = false;
  std::vector<AllocatorResult> results;
};

// Median over passes of seconds per pass / events, in nanoseconds (0 without passes).
inline double median_ns_per_op(std::vector<double> pass_seconds, std::uint64_t events) {
  if (pass_seconds.empty() || events == 0) return 0;
  std::sort(pass_seconds.begin(), pass_seconds.end());
  const std::size_t n = pass_seconds.size();
  const double median =
      n % 2 == 1 ? pass_seconds[n / 2] : (pass_seconds[n / 2 - 1] + pass_seconds[n / 2]) / 2;
  return median * 1e9 / double(events);
}

// The exit status `sdalloc replay` gives for these results: 4 when an allocator failed
// (AllocatorResult::failed), else 3 when one ran out of memory, else 0.
inline int replay_exit_status(const std::vector<AllocatorResult>& results) {
  int status = 0;
  for (const AllocatorResult& r : results) {
    if (r.ran) continue;
    if (r.failed) return 4;
    if (r.problem.rfind("out of memory", 0) == 0) status = 3;
  }
  return status;
}

}  // namespace sdalloc::replay
