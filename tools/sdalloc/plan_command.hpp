// tools/sdalloc/plan_command.hpp - `sdalloc plan`: static memory planning for a known schedule.
//
//     sdalloc plan INPUT [--output FILE] [--capacity B] [--time-limit S] [--threads N]
//                  [--max-nodes N] [--json]
//
// INPUT is MiniMalloc's CSV (`id,lower,upper,size`) or an event trace (`op,id,size[,stream]`,
// plain or gzip; time = event index, see sdalloc/planner/planner.hpp). The planner runs the greedy
// heuristics and the canonical search (sdalloc::plan) and prints the arena size, the lower
// bound (peak live bytes), their ratio and the time; --json prints one object
// {"arena": B, "lower_bound": B, "ratio": R, "seconds": S, "fits": bool} instead. --output
// writes `id,lower,upper,size,offset`. With --capacity B the planner looks for a plan within
// B bytes (suffixes K, M, G) and the exit status says whether it found one. --threads N
// (default 0: one per hardware thread) runs the minimiser's probes on N threads;
// --max-nodes N stops the search after N nodes (the same plan on every machine, one thread).
// Searches longer than a second print progress on stderr.
// Exit status: 0 a plan (within the capacity, if given), 1 bad input, 2 bad usage,
// 3 no plan within the capacity was found in the time limit.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

namespace sdalloc::tools {

struct PlanOptions {
  std::string input;
  std::string output;
  std::uint64_t capacity = 0;
  double time_limit = 10.0;
  unsigned threads = 0;         // 0: one per hardware thread
  std::uint64_t max_nodes = 0;  // 0: no node limit
  bool json = false;
};

struct PlanCommand {
  PlanOptions options;
  CLI::App* subcommand = nullptr;

  void add_to(CLI::App& app);  // registers `plan` and its options
  int run() const;             // the exit status above; throws on bad input
};

}  // namespace sdalloc::tools
