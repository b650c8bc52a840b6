// `sdalloc replay` (replay_command.hpp).
#include "replay_command.hpp"
#include "command_line.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>

#include "config/pool_conf.hpp"
#include "replay/html_report.hpp"
#include "replay/replay_output.hpp"
#include "sdalloc/core/errors.hpp"
#include "sdalloc/trace/trace_input.hpp"
#include "size_option.hpp"

namespace sdalloc::tools {
namespace {

// "out.json" for the first trace, "out-2.json" for the second...
std::string numbered_path(const std::string& path, std::size_t index) {
  if (index == 0) return path;
  const std::filesystem::path p(path);
  return (p.parent_path() /
          (p.stem().string() + "-" + std::to_string(index + 1) + p.extension().string()))
      .string();
}

// SDALLOC_CONF's caching pool rows (mode, capacity and the planned arena's rows would mean
// nothing here): one table, so the help below lists what parse accepts.
const config::OptionTable<config::PoolConf>& pool_conf_table() {
  using config::PoolConf;
  static const config::OptionTable<PoolConf> table("--pool-conf", config::caching_pool_options(),
                                                   [](PoolConf& conf, const config::KeySet& given) {
                                                     config::raise_to_granularity(conf, given);
                                                     config::validate_pool_conf("--pool-conf",
                                                                                conf);
                                                   });
  return table;
}

std::string pool_conf_keys() {
  std::string keys;
  for (const auto& row : pool_conf_table().rows()) {
    if (row.spec.type == config::OptionType::kRetired) continue;
    keys += (keys.empty() ? "" : ", ") + std::string(row.spec.key);
  }
  return keys;
}

}  // namespace

CachingPoolOptions parse_pool_conf(std::string_view text) {
  return pool_conf_table().parse(text).pool;
}

void ReplayCommand::add_to(CLI::App& app) {
  CLI::App* replay = app.add_subcommand(
      "replay",
      "Replay allocation traces through sdalloc and the system allocators, side by side: peak "
      "memory held, its ratio to peak live bytes, and time per operation.");
  replay->add_option("trace", options.traces,
                     "event trace or RMM log, plain or gzip, - for stdin (default: the bundled "
                     "SD 1.5 UNet trace)");
  std::string names;
  for (const std::string& n : replay::allocator_names()) names += (names.empty() ? "" : ",") + n;
  replay
      ->add_option("--allocator,-a", options.allocators,
                   "comma-separated allocators (default: all of " + names + ")")
      ->check(
          [names](const std::string& list) -> std::string {
            const std::vector<std::string> known = replay::allocator_names();
            for (const std::string& name : split_list(list)) {
              if (std::find(known.begin(), known.end(), name) == known.end()) {
                std::string message = "unknown allocator '" + name + "' (known: ";
                message += names;
                message += ")";
                return message;
              }
            }
            return {};
          },
          "ALLOCATORS");
  replay->add_option("--passes,-n", options.replay.passes, "replay each trace this many times")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  replay
      ->add_option("--capacity", options.replay.capacity,
                   "cap sdalloc's allocators like a device of this size (e.g. 2500M, 8G)")
      ->transform(byte_size_option());
  replay->add_flag("--min-capacity", options.replay.min_capacity,
                   "find the least capacity each sdalloc allocator needs (bisection)");
  replay->add_flag("--touch", options.replay.touch,
                   "write every 4 KiB page of each allocation, as a tensor would be written");
  replay->add_option("--json", options.json_path, "write the results as JSON to this file");
  replay->add_option("--report", options.report_path,
                     "write a self-contained HTML report (plots, table, size histogram)");
  replay->add_flag("--huge-pages", options.replay.target.huge_pages,
                   "sdalloc's host memory asks for transparent huge pages");
  replay->add_flag("--pool-keep-cache", options.replay.target.pool_keep_cache,
                   "pool: never release cached segments to grow (release only on OOM)");
  replay->add_flag("--pool-no-consolidation", options.replay.target.pool_no_consolidation,
                   "pool: keep a churning stream's segments instead of one arena");
  replay->add_flag("--device-like", options.replay.target.device_like,
                   "vmm: 2 MiB pages that cannot move (they are unmapped and mapped), as on "
                   "CUDA's virtual memory (pool and planned take whole segments either way)");
  replay->add_flag("--vmm-no-moves", options.replay.target.vmm_no_moves,
                   "vmm: unmap and map each page it moves instead of moving runs of them "
                   "(mremap)");
  replay
      ->add_option("--pool-conf", options.pool_conf,
                   "pool (and planned's fallback): the segment cache's options in "
                   "SDALLOC_CONF's spelling, e.g. huge_threshold:128MiB,consolidate:false "
                   "(keys: " +
                       pool_conf_keys() + ")")
      ->check(
          [](const std::string& text) -> std::string {
            try {
              static_cast<void>(parse_pool_conf(text));
            } catch (const InvalidArgument& e) {
              return e.what();
            }
            return {};
          },
          "CONF");
  replay->add_flag("--quiet,-q", options.quiet, "no progress lines on stderr");
  subcommand = replay;
}

int ReplayCommand::run() const {
  std::vector<std::string> traces = options.traces;
  if (traces.empty()) traces.emplace_back(SDALLOC_DEFAULT_TRACE);
  replay::ReplayOptions replay_options = options.replay;
  replay_options.allocators = split_list(options.allocators);
  replay_options.progress = !options.quiet;
  replay_options.target.pool = parse_pool_conf(options.pool_conf);
  int status = 0;
  for (std::size_t t = 0; t < traces.size(); ++t) {
    const TraceInput input = read_trace_input(traces[t]);
    for (const std::string& note : input.notes) {
      std::fprintf(stderr, "sdalloc replay: %s: %s\n", traces[t].c_str(), note.c_str());
    }
    const replay::ReplayRun run = replay::run_replay(input.trace, replay_options);
    if (t > 0) std::printf("\n");
    std::printf("%s", replay::format_table(run).c_str());
    std::fflush(stdout);
    status = std::max(status, replay::replay_exit_status(run.results));  // 4 before 3
    if (!options.json_path.empty()) replay::write_json(run, numbered_path(options.json_path, t));
    if (!options.report_path.empty()) {
      replay::write_html_report(run, input.trace, numbered_path(options.report_path, t));
    }
  }
  return status;
}

void ReplayChildCommand::add_to(CLI::App& app) {
  CLI::App* child = app.add_subcommand("__replay-child", "");  // hidden: empty description
  child->group("");
  child->add_option("--allocator", allocator)->required();
  child->add_option("--trace", settings.trace_path)->required();
  child->add_option("--passes", settings.passes)->check(CLI::Range(1, 100000));
  child->add_flag("--touch", settings.touch);
  child->add_flag("--quiet", quiet);
  subcommand = child;
}

int ReplayChildCommand::run() const {
  replay::ChildReplaySettings s = settings;
  s.progress = !quiet;
  return replay::run_replay_child(allocator, s);
}

}  // namespace sdalloc::tools
