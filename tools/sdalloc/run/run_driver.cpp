#include "run/run_driver.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>

#include "replay/progress_line.hpp"
#include "sdalloc/core/errors.hpp"

namespace sdalloc::run {
namespace {

// A scratch directory for the children's stderr and the drop-in's reports, removed after.
class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "sdalloc-run-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      throw Error("cannot create a scratch directory " + pattern + ": " + std::strerror(errno));
    }
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code error;
    std::filesystem::remove_all(path_, error);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

template <typename F>
double median_of(const std::vector<const RunSample*>& runs, F figure) {
  std::vector<double> values;
  values.reserve(runs.size());
  for (const RunSample* r : runs) values.push_back(double(figure(r->outcome)));
  return median(values);
}

}  // namespace

// ---------------------------------------------------------------- results
const RunSample* AllocatorRuns::failure() const {
  for (const RunSample& r : runs) {
    if (!r.outcome.succeeded()) return &r;
  }
  return nullptr;
}

std::optional<Medians> AllocatorRuns::medians() const {
  std::vector<const RunSample*> ok;
  for (const RunSample& r : runs) {
    if (r.outcome.succeeded()) ok.push_back(&r);
  }
  if (ok.empty()) return std::nullopt;
  Medians m;
  m.wall_seconds = median_of(ok, [](const ChildOutcome& o) { return o.wall_seconds; });
  m.user_seconds = median_of(ok, [](const ChildOutcome& o) { return o.user_seconds; });
  m.system_seconds = median_of(ok, [](const ChildOutcome& o) { return o.system_seconds; });
  m.peak_rss_bytes =
      std::uint64_t(median_of(ok, [](const ChildOutcome& o) { return o.peak_rss_bytes; }));
  m.minor_faults =
      std::uint64_t(median_of(ok, [](const ChildOutcome& o) { return o.minor_faults; }));
  m.major_faults =
      std::uint64_t(median_of(ok, [](const ChildOutcome& o) { return o.major_faults; }));
  return m;
}

bool RunReport::command_failed() const {
  return std::any_of(results.begin(), results.end(),
                     [](const AllocatorRuns& r) { return r.failure() != nullptr; });
}

std::vector<std::pair<std::size_t, int>> interleaved_order(std::size_t allocators, int repeat) {
  std::vector<std::pair<std::size_t, int>> order;
  for (int round = 1; round <= repeat; ++round) {
    for (std::size_t a = 0; a < allocators; ++a) order.emplace_back(a, round);
  }
  return order;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// ---------------------------------------------------------------- the rounds
RunReport run_under_allocators(const RunOptions& options) {
  if (options.command.empty())
    throw Error("no command given (sdalloc run [options] -- COMMAND ...)");
  if (find_program(options.command.front()).empty()) {
    throw Error("command not found: " + options.command.front());
  }
  std::vector<const RunAllocator*> allocators;
  for (const std::string& name :
       options.allocators.empty() ? run_allocator_names() : options.allocators) {
    const RunAllocator* a = find_run_allocator(name);
    if (a == nullptr) throw Error("unknown allocator '" + name + "'");
    allocators.push_back(a);
  }
  const ScratchDir scratch;
  const std::string preload_library = resolve_preload_library(options.preload_library);
  RunReport report;
  report.command = options.command;
  report.repeat = options.repeat;
  report.warmup = options.warmup;
  std::vector<Launch> launches;
  for (std::size_t i = 0; i < allocators.size(); ++i) {
    const std::string report_path = scratch.file("report-" + std::to_string(i) + ".json");
    launches.push_back(launch_for(*allocators[i], preload_library, report_path));
    report.results.push_back(
        {allocators[i]->name, allocators[i]->description, launches.back().problem, {}});
  }
  auto spec_for = [&](std::size_t i) {
    ChildSpec spec;
    spec.argv = options.command;
    spec.preload = launches[i].preload;
    spec.environment = launches[i].environment;
    spec.stdout_path = scratch.file("stdout.txt");
    spec.stderr_path = scratch.file("stderr.txt");
    spec.show_output = options.show_output;
    return spec;
  };

  replay::ProgressLine progress("sdalloc run");
  // What run_child calls while it waits: the progress line, or nothing with --quiet.
  auto progress_for = [&](const std::string& where) -> std::function<void()> {
    if (!options.progress) return {};
    return [&progress, where] { progress.report(where); };
  };
  const auto first_runnable = std::find_if(launches.begin(), launches.end(),
                                           [](const Launch& l) { return l.problem.empty(); });
  for (int w = 1; w <= options.warmup && first_runnable != launches.end(); ++w) {
    const auto i = std::size_t(first_runnable - launches.begin());
    const std::string where = "warm-up " + std::to_string(w) + "/" +
                              std::to_string(options.warmup) + " under " + allocators[i]->name;
    run_child(spec_for(i), progress_for(where));
  }
  for (const auto& [i, round] : interleaved_order(allocators.size(), options.repeat)) {
    AllocatorRuns& result = report.results[i];
    if (!result.problem.empty() || result.failure() != nullptr) continue;
    const std::string where = "round " + std::to_string(round) + "/" +
                              std::to_string(options.repeat) + ": " + result.allocator;
    if (!launches[i].report_path.empty()) std::filesystem::remove(launches[i].report_path);
    RunSample sample;
    sample.round = round;
    sample.outcome = run_child(spec_for(i), progress_for(where));
    if (!launches[i].report_path.empty()) {
      sample.report = read_sdalloc_report(launches[i].report_path, sample.report_problem);
    }
    result.runs.push_back(std::move(sample));
    report.order.push_back(result.allocator);
  }
  if (options.progress) progress.done();
  return report;
}

}  // namespace sdalloc::run
