// `sdalloc run` (run_command.hpp).
#include "run_command.hpp"
#include "command_line.hpp"

#include <algorithm>
#include <cstdio>

#include "run/run_output.hpp"
#include "sdalloc/core/errors.hpp"

namespace sdalloc::tools {
namespace {}  // namespace

void RunCommand::add_to(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "run",
      "Run a program under each allocator (interleaved rounds) and compare median wall time, "
      "peak RSS, page faults and CPU time: sdalloc run [options] -- COMMAND ...");
  std::string names;
  for (const std::string& n : run::run_allocator_names()) names += (names.empty() ? "" : ",") + n;
  cmd->add_option("--allocator,-a", allocators,
                  "comma-separated allocators (default: all of " + names + ")")
      ->check(
          [names](const std::string& list) -> std::string {
            if (split_list(list).empty()) return "no allocator named";
            for (const std::string& name : split_list(list)) {
              if (run::find_run_allocator(name) == nullptr) {
                return std::string("unknown allocator '")
                    .append(name)
                    .append("' (known: ")
                    .append(names)
                    .append(")");
              }
            }
            return {};
          },
          "ALLOCATORS");
  cmd->add_option("--repeat,-n", options.repeat,
                  "rounds: the command runs this many times under each allocator")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  cmd->add_option("--warmup", options.warmup,
                  "untimed runs first, under the first allocator (fills the page cache)")
      ->check(CLI::Range(0, 100))
      ->capture_default_str();
  cmd->add_option("--json", json_path, "write the results as JSON to this file");
  cmd->add_option("--preload-library", options.preload_library,
                  "sdalloc's drop-in library (default: $SDALLOC_PRELOAD_LIBRARY, else the "
                  "one this build made)");
  cmd->add_flag("--show-output", options.show_output,
                "let the command write to this terminal (its stderr is then not in the notes)");
  cmd->add_flag("--quiet,-q", quiet, "no progress line on stderr");
  cmd->add_option("command", options.command, "the program and its arguments, after --")
      ->required();
  subcommand = cmd;
}

int RunCommand::run() const {
  run::RunOptions o = options;
  o.allocators = split_list(allocators);
  o.progress = !quiet;
  if (run::find_program(o.command.front()).empty()) {
    std::fprintf(stderr, "sdalloc run: command not found: %s\n", o.command.front().c_str());
    return 2;
  }
  const run::RunReport report = run::run_under_allocators(o);
  std::printf("%s", run::format_run_table(report).c_str());
  std::fflush(stdout);
  if (!json_path.empty()) run::write_run_json(report, json_path);
  return report.command_failed() ? 3 : 0;
}

}  // namespace sdalloc::tools
