// tools/sdalloc/replay_command.hpp - `sdalloc replay`, the main job: replay real allocation traces
// through sdalloc and the allocators people use, side by side.
//
//     sdalloc replay [TRACE...] [--allocator LIST] [--passes N] [--capacity BYTES]
//                    [--min-capacity] [--touch] [--json FILE] [--report FILE.html]
//                    [--huge-pages] [--pool-keep-cache] [--pool-no-consolidation]
//                    [--vmm-no-moves] [--device-like]
//                    [--pool-conf KEY:VALUE,...] [--quiet]
//
// TRACE: an event trace or an RMM log, plain or gzip, "-" for standard input (PyTorch
// snapshots: convert them with tools/torch_snapshot_to_trace.py first); without TRACE the
// bundled SD 1.5 UNet trace (data/traces/sd15_unet_b2_64x64_cpu_2pass.csv). Each trace is
// replayed `--passes` times (default 3) through every allocator of --allocator (comma
// separated; default all: vmm, pool, planned, torch-native, torch-expandable, glibc,
// jemalloc, mimalloc, tcmalloc) and one table per trace is printed (replay_output.hpp
// explains the columns). --capacity caps what
// sdalloc's allocators may hold, like a device of that size (suffixes K, M, G; a system
// allocator is only flagged when it exceeds it); --min-capacity bisects the least capacity
// each of sdalloc's allocators needs. --touch writes every 4 KiB page of each allocation.
// --json FILE and --report FILE.html (replay_output.hpp, replay/html_report.hpp) write one
// file per trace: with several traces, "-N" goes before the extension for trace N >= 2.
// Exit status: 0 every allocator ran (or was skipped as not installed), 1 a bad trace or an
// error writing output, 2 bad usage, 3 an allocator ran out of memory (under --capacity, or
// a request beyond what the machine has), 4 an allocator failed for another reason (an
// error from it, a child process that crashed; its row says why), before 3.
// --pool-conf sets the CachingPool's options (pool, and planned's fallback) with the
// SDALLOC_CONF rows of src/config/pool_conf.hpp, so a policy is spelled the same everywhere.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <string_view>
#include <vector>

#include "replay/replay_driver.hpp"
#include "replay/system_allocators.hpp"

namespace sdalloc::tools {

struct ReplayCommandOptions {
  std::vector<std::string> traces;
  std::string allocators;  // comma separated
  std::string json_path;
  std::string report_path;
  std::string pool_conf;  // --pool-conf, parsed by parse_pool_conf
  bool quiet = false;
  replay::ReplayOptions replay;
};

// The CachingPool options of a --pool-conf text ("" gives the defaults); InvalidArgument
// names the bad pair, as SDALLOC_CONF's messages do.
CachingPoolOptions parse_pool_conf(std::string_view text);

struct ReplayCommand {
  ReplayCommandOptions options;
  CLI::App* subcommand = nullptr;

  void add_to(CLI::App& app);  // registers `replay` and its options
  int run() const;             // the exit status above; throws on a bad trace
};

// The hidden `__replay-child` subcommand that measures one system allocator
// (replay/system_allocators.hpp); not for users.
struct ReplayChildCommand {
  std::string allocator;
  replay::ChildReplaySettings settings;
  bool quiet = false;
  CLI::App* subcommand = nullptr;

  void add_to(CLI::App& app);
  int run() const;
};

}  // namespace sdalloc::tools
