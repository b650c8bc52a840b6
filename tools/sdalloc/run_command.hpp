// tools/sdalloc/run_command.hpp - `sdalloc run`: a real program under each allocator, side by side.
//
//     sdalloc run [--allocator LIST] [--repeat N] [--warmup N] [--json FILE]
//                 [--preload-library PATH] [--show-output] [--quiet] -- COMMAND [ARG...]
//
// Runs COMMAND under every allocator of --allocator (comma separated; default all: glibc,
// jemalloc, mimalloc, tcmalloc, sdalloc-pool, sdalloc-vmm, sdalloc-planned; see
// run/run_allocators.hpp for how each is put in place), --repeat rounds interleaved
// (A B C A B C: run/run_driver.hpp), and prints one table of medians: wall time, peak RSS,
// minor page faults, user and system time, and sdalloc's own report (run/run_output.hpp).
// It answers "what would sdalloc do for my inference script?". The command's stdout and
// stderr are captured (their tails go to the JSON and, for a failure, the notes) unless
// --show-output lets it write to this terminal.
// Exit status: 0 the command succeeded under every allocator that could run (one not
// installed or not built is listed, not an error), 1 an error (e.g. writing --json),
// 2 bad usage (also: COMMAND not found), 3 the command failed under an allocator (its row
// says how; the other rows are still printed).
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "run/run_driver.hpp"

namespace sdalloc::tools {

struct RunCommand {
  run::RunOptions options;
  std::string allocators;  // comma separated
  std::string json_path;
  bool quiet = false;
  CLI::App* subcommand = nullptr;

  void add_to(CLI::App& app);  // registers `run` and its options
  int run() const;             // the exit status above
};

}  // namespace sdalloc::tools
