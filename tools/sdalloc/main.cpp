// sdalloc - the command-line program.
//
//     sdalloc replay [TRACE...] [options]   the main job (replay_command.hpp)
//     sdalloc plan INPUT [options]          static memory planning (plan_command.hpp)
//     sdalloc run [options] -- COMMAND ...  a real program under each allocator (run_command.hpp)
//
// Errors are one line on stderr naming the command and what is wrong; exit status 1 for bad
// input, 2 for bad usage, others as each command documents.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>

#include "plan_command.hpp"
#include "replay_command.hpp"
#include "run_command.hpp"
#include "sdalloc/trace/event_trace.hpp"
#include "sdalloc/version.hpp"

namespace {

int run(int argc, char** argv) {
  CLI::App app{"sdalloc: a memory manager for deep-learning inference. Commands:"};
  app.set_version_flag("--version", SDALLOC_VERSION_STRING);
  app.require_subcommand(1);
  sdalloc::tools::ReplayCommand replay;
  sdalloc::tools::PlanCommand plan;
  sdalloc::tools::RunCommand run_command;
  sdalloc::tools::ReplayChildCommand replay_child;
  replay.add_to(app);
  plan.add_to(app);
  run_command.add_to(app);
  replay_child.add_to(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error) == 0 ? 0 : 2;
  }
  const char* command = "sdalloc";
  try {
    if (replay.subcommand->parsed()) {
      command = "sdalloc replay";
      return replay.run();
    }
    if (plan.subcommand->parsed()) {
      command = "sdalloc plan";
      return plan.run();
    }
    if (run_command.subcommand->parsed()) {
      command = "sdalloc run";
      return run_command.run();
    }
    command = "sdalloc __replay-child";
    return replay_child.run();
  } catch (const sdalloc::TraceFormatError& error) {
    std::fprintf(stderr, "%s: bad trace: %s\n", command, error.what());
  } catch (const std::exception& error) {
    std::fprintf(stderr, "%s: error: %s\n", command, error.what());
  }
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& error) {  // e.g. out of memory while setting up
    std::fprintf(stderr, "sdalloc: error: %s\n", error.what());
  } catch (...) {
    std::fprintf(stderr, "sdalloc: unknown error\n");
  }
  return 1;
}
