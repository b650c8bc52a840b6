// tools/sdalloc/run/run_allocators.hpp - the allocators `sdalloc run` runs a program under, and how
// a child process gets each one.
//
// glibc, jemalloc, mimalloc, tcmalloc: Debian's libraries, found as `sdalloc replay` finds them
// (replay/system_allocators.hpp) and LD_PRELOADed; glibc runs with LD_PRELOAD removed.
// sdalloc-pool, sdalloc-vmm, sdalloc-planned: sdalloc's drop-in library
// (libsdalloc_preload.so) LD_PRELOADed with SDALLOC_PRELOAD_CONF=mode:<m>,report:<file>.json
// (the -huge variants add huge_pages:true: transparent huge pages on the pool's memory); the
// library writes its report to <file> as one JSON object (SdallocReport). The drop-in's path is
// --preload-library, else $SDALLOC_PRELOAD_LIBRARY, else the one this build made (when it
// made one). A missing library is not an error: the launch carries the reason instead.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "replay/system_allocators.hpp"

namespace sdalloc::run {

struct RunAllocator {
  std::string name;  // as given to --allocator
  std::string description;
  std::string sdalloc_mode;                         // "pool", "vmm", "planned"; "" for the others
  const replay::SystemAllocator* system = nullptr;  // the others' library
  std::string sdalloc_conf;  // more of the drop-in's keys ("huge_pages:true"), or ""
};

// glibc, jemalloc, mimalloc, tcmalloc, sdalloc-pool, sdalloc-vmm, sdalloc-planned and
// sdalloc-{pool,vmm,planned}-huge.
const std::vector<RunAllocator>& run_allocators();
std::vector<std::string> run_allocator_names();
const RunAllocator* find_run_allocator(const std::string& name);

// What the child's environment gets for one allocator, or why it cannot run.
struct Launch {
  std::string preload;                                           // LD_PRELOAD; "" = none
  std::vector<std::pair<std::string, std::string>> environment;  // set in the child
  std::string report_path;  // sdalloc modes: the file the drop-in writes
  std::string problem;      // not empty: the allocator cannot run, and why
};

// report_path: where an sdalloc mode's report goes; preload_library: the drop-in's path
// from resolve_preload_library ("" when none is known).
Launch launch_for(const RunAllocator& allocator, const std::string& preload_library,
                  const std::string& report_path);

// The drop-in's path: `option` when not empty, else $SDALLOC_PRELOAD_LIBRARY, else the
// build's own (SDALLOC_PRELOAD_LIBRARY_DEFAULT); "" when none of them is set.
std::string resolve_preload_library(const std::string& option);

// The drop-in's report: {"mode": S, "peak_live_bytes": N, "peak_reserved_bytes": N,
// "pool_allocations": N, "system_allocations": N}.
struct SdallocReport {
  std::string mode;
  std::uint64_t peak_live_bytes = 0;
  std::uint64_t peak_reserved_bytes = 0;
  std::uint64_t pool_allocations = 0;
  std::uint64_t system_allocations = 0;
};

// nullopt with `problem` empty when the file does not exist, with `problem` set when it
// exists but cannot be read as a report.
std::optional<SdallocReport> read_sdalloc_report(const std::string& path, std::string& problem);

}  // namespace sdalloc::run
