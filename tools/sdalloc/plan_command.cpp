// `sdalloc plan` - static memory planning for a known schedule of buffers (plan_command.hpp).
#include "plan_command.hpp"

#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/planner/planner.hpp"
#include "sdalloc/trace/event_trace.hpp"
#include "sdalloc/trace/trace_input.hpp"
#include "size_option.hpp"

namespace sdalloc::tools {
namespace {

// MiniMalloc CSVs start with "id,"; anything else (including gzip) is read as an event trace.
// Only those 3 bytes are read to tell: a file with no line end (/dev/zero) must not be read
// whole here.
std::vector<sdalloc::Buffer> read_buffers(const std::string& path) {
  if (path != "-") {
    std::ifstream in(path);
    std::array<char, 3> head{};
    if (in && in.read(head.data(), head.size()) && std::string_view(head.data(), 3) == "id,") {
      return sdalloc::read_interval_csv(path);
    }
  }
  return sdalloc::buffers_from_trace(sdalloc::read_any_trace(path));
}

}  // namespace

int PlanCommand::run() const {
  const std::vector<sdalloc::Buffer> buffers = read_buffers(options.input);
  sdalloc::PlannerOptions planner_options;
  planner_options.capacity = options.capacity;
  planner_options.time_limit_seconds = options.time_limit;
  planner_options.threads = options.threads;
  planner_options.max_search_nodes = options.max_nodes;
  planner_options.progress = [](const sdalloc::PlanProgress& progress) {
    std::fprintf(stderr, "  %6.1f s  best arena %llu  lower bound %llu  probing %llu  %llu nodes\n",
                 progress.seconds, static_cast<unsigned long long>(progress.best_arena),
                 static_cast<unsigned long long>(progress.lower_bound),
                 static_cast<unsigned long long>(progress.probing),
                 static_cast<unsigned long long>(progress.nodes));
  };
  const sdalloc::PlanResult result = sdalloc::plan(buffers, planner_options);

  if (!options.output.empty()) {
    std::ofstream out(options.output);
    if (!out) throw sdalloc::InvalidArgument(options.output + ": cannot open for writing");
    sdalloc::write_plan_csv(buffers, result.plan, out);
    out.close();
    if (!out) throw sdalloc::InvalidArgument(options.output + ": write failed");
  }
  const double ratio = result.lower_bound == 0 ? 1.0
                                               : static_cast<double>(result.plan.arena_size) /
                                                     static_cast<double>(result.lower_bound);
  if (options.json) {
    const nlohmann::json report = {{"arena", result.plan.arena_size},
                                   {"lower_bound", result.lower_bound},
                                   {"ratio", ratio},
                                   {"seconds", result.seconds},
                                   {"timed_out", result.timed_out},
                                   {"cut_short", result.cut_short},
                                   {"fits", result.fits}};
    std::printf("%s\n", report.dump().c_str());
  } else {
    std::printf("buffers:     %zu\n", buffers.size());
    std::printf("arena:       %s\n", sdalloc::format_bytes(result.plan.arena_size).c_str());
    std::printf("lower bound: %s\n", sdalloc::format_bytes(result.lower_bound).c_str());
    std::printf("ratio:       %.4f\n", ratio);
    std::printf("method:      %s%s%s\n", result.method.c_str(), result.optimal ? " (optimal)" : "",
                result.cut_short   ? " (cut short by the time limit: the rest stacked)"
                : result.timed_out ? " (time limit)"
                                   : "");
    if (options.capacity != 0) {
      std::printf("capacity:    %s: %s\n", sdalloc::format_bytes(options.capacity).c_str(),
                  result.fits ? "fits" : "no plan found within it");
    }
    std::printf("seconds:     %.3f\n", result.seconds);
  }
  return result.fits ? 0 : 3;
}

void PlanCommand::add_to(CLI::App& app) {
  CLI::App* plan = app.add_subcommand(
      "plan", "Plan offsets for buffers with known lifetimes in one arena (static planning).");
  plan->add_option("input", options.input, "MiniMalloc CSV (id,lower,upper,size) or event trace")
      ->required();
  plan->add_option("--output,-o", options.output, "write id,lower,upper,size,offset here");
  plan->add_option("--capacity", options.capacity, "look for a plan within this many bytes")
      ->transform(byte_size_option());
  plan->add_option("--time-limit", options.time_limit,
                   "seconds the planner may spend (above 1e9: 1e9, no limit in effect)")
      ->check(seconds_option())
      ->capture_default_str();
  plan->add_option("--threads", options.threads,
                   "threads for the search's probes without --capacity (0: one per hardware "
                   "thread; at most 64)")
      ->check(CLI::Range(0U, sdalloc::PlannerOptions::kMaxThreads))
      ->capture_default_str();
  plan->add_option("--max-nodes", options.max_nodes,
                   "stop the search after this many nodes in all (0: no limit): the same plan "
                   "on every machine and run (one thread)")
      ->check(count_option())
      ->capture_default_str();
  plan->add_flag("--json", options.json, "print one JSON object");
  subcommand = plan;
}

}  // namespace sdalloc::tools
