// tools/sdalloc/run/run_driver.hpp - `sdalloc run`'s driver: one command under each allocator, in
// interleaved rounds, and the medians.
//
// Round r runs the command once under every allocator, in the order given (A B C A B C ...),
// so a drift of the machine (a build starting, the page cache filling, thermal limits) falls
// on every allocator alike instead of on the last one. --warmup runs the command that many
// times first, untimed, under the first allocator that can run (the page cache then holds
// the program's files for everyone). An allocator that cannot run (library not installed,
// drop-in not built) is listed with the reason and is not an error; one under which the
// command fails (non-zero exit status, a signal, LD_PRELOAD refused) keeps its exit status
// and stderr tail and runs no further rounds, and the others go on.
// Medians are over an allocator's successful runs; each figure's median is taken on its own.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "run/child_process.hpp"
#include "run/run_allocators.hpp"

namespace sdalloc::run {

struct RunOptions {
  std::vector<std::string> command;
  std::vector<std::string> allocators;  // names from run_allocator_names(); empty = all
  int repeat = 1;
  int warmup = 0;
  std::string preload_library;  // --preload-library ("" = $SDALLOC_PRELOAD_LIBRARY or built)
  bool show_output = false;
  bool progress = true;
};

struct RunSample {
  int round = 0;  // 1-based
  ChildOutcome outcome;
  std::optional<SdallocReport> report;  // sdalloc modes, when the drop-in wrote one
  std::string report_problem;           // the report exists but is unreadable
};

struct Medians {
  double wall_seconds = 0;
  double user_seconds = 0;
  double system_seconds = 0;
  std::uint64_t peak_rss_bytes = 0;
  std::uint64_t minor_faults = 0;
  std::uint64_t major_faults = 0;
};

struct AllocatorRuns {
  std::string allocator;
  std::string description;
  std::string problem;  // not empty: it could not run at all
  std::vector<RunSample> runs;

  const RunSample* failure() const;        // the failed run, if one failed
  std::optional<Medians> medians() const;  // nullopt without a successful run
};

struct RunReport {
  std::vector<std::string> command;
  int repeat = 1;
  int warmup = 0;
  std::vector<AllocatorRuns> results;  // in --allocator order
  std::vector<std::string> order;      // the allocator of each timed run, as run

  bool command_failed() const;  // under some allocator
};

// (allocator index, round) in the order they run: round by round, allocators in order.
std::vector<std::pair<std::size_t, int>> interleaved_order(std::size_t allocators, int repeat);

// The median of values (the mean of the middle two for an even count); 0 for none.
double median(std::vector<double> values);

// Runs it all. Throws sdalloc::Error for an unknown allocator name, an empty command, or a
// program that is not found, before anything runs.
RunReport run_under_allocators(const RunOptions& options);

}  // namespace sdalloc::run
