// tools/sdalloc/replay/system_allocators.hpp - glibc, jemalloc, mimalloc and tcmalloc, measured in
// child processes.
//
// malloc cannot be swapped inside a running process, so each system allocator replays the
// trace in a child: this same program, run as `sdalloc __replay-child`, with LD_PRELOAD
// naming Debian's library (glibc: nothing preloaded). The child checks that the preload
// took effect (a symbol only that library defines), replays the trace with malloc/free
// through the same loop as the in-process allocators (trace_player.hpp), and prints one
// JSON object on stdout. What it holds is its resident memory: the child resets the peak
// (writing 5 to /proc/self/clear_refs), takes the resident size as its baseline, and
// reports VmHWM minus the baseline as peak reserved. Without --touch, untouched pages of
// large blocks are not resident, so the figure counts only what the allocator touched.
// A missing library is not an error: the result says which package provides it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "replay/replay_result.hpp"

namespace sdalloc::replay {

struct SystemAllocator {
  std::string name;  // as given to --allocator
  std::string description;
  std::vector<std::string> libraries;  // file names to LD_PRELOAD, first found wins
  std::string package;                 // the Debian package with the library
  std::string marker;                  // a symbol only this allocator defines ("" for glibc)
};

// glibc, jemalloc, mimalloc, tcmalloc.
const std::vector<SystemAllocator>& system_allocators();

// The path of the allocator's library in the system's library directories; nullopt when it
// is not installed. glibc's answer is "" (nothing to preload).
std::optional<std::string> find_preload_library(const SystemAllocator& allocator);

// True when this program is built with a sanitizer: its runtime owns malloc, so a preloaded
// allocator cannot be measured.
bool built_with_sanitizer();

struct ChildReplaySettings {
  std::string trace_path;  // an event trace file the child reads
  int passes = 1;
  bool touch = false;
  bool progress = true;
};

// Runs the child for one allocator and turns its JSON into a result (ran = false with the
// reason when the library is missing, the preload failed, or the child failed).
AllocatorResult run_system_allocator(const SystemAllocator& allocator,
                                     const ChildReplaySettings& settings, std::uint64_t peak_live);

// The child's side: `sdalloc __replay-child --allocator NAME --trace FILE --passes N
// [--touch]`. Prints the JSON object on stdout; returns the exit status.
int run_replay_child(const std::string& allocator, const ChildReplaySettings& settings);

}  // namespace sdalloc::replay
