// main.cpp - runs sdalloc_bench's benchmarks, then prints what they mean.
//
// Google Benchmark prints one line per run; the questions asked of this allocator are
// ratios between runs: pool versus malloc on the same work, two threads versus one. So main
// runs the benchmarks through a console reporter that also keeps every run, then prints:
//   ratio pool/malloc (cached 4096 B): 0.87               (per size, single thread)
//   per-thread rate with 2 threads / single-thread rate   (pool, and malloc for comparison)
//   ratio pool/malloc (trace ...)                         (ns per event of the trace replay)
// and the two targets with PASS/FAIL: cached alloc+free, one thread, median <= 60 ns;
// with 2 threads on different streams each keeps >= 60 % of the single-thread rate. They are
// informational: the program exits 0 whatever they say (a benchmark is not a test; CI
// machines are noisy).
//
// Without --benchmark_repetitions on the command line, every benchmark runs 5 times and the
// figures used are the medians. Other Google Benchmark flags work as usual.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

constexpr double kCachedTargetNs = 60.0;
constexpr double kThreadRateTarget = 0.60;
constexpr int kDefaultRepetitions = 5;

// One benchmark instance's figure: the median over repetitions when there are several,
// else the single run's.
struct Figure {
  double real_ns_per_iteration = 0;
  double events = 0;  // the trace benchmarks' "events" counter
  bool from_median = false;
};

// Prints like the standard console reporter and keeps each instance's figure, keyed by
// "function/args/threads:N".
class RecordingReporter : public benchmark::ConsoleReporter {
 public:
  explicit RecordingReporter(OutputOptions options) : ConsoleReporter(options) {}

  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      if (run.error_occurred) continue;
      const bool median = run.run_type == Run::RT_Aggregate && run.aggregate_name == "median";
      if (run.run_type == Run::RT_Aggregate && !median) continue;
      Figure& figure = figures_[key(run.run_name.function_name, run.run_name.args, run.threads)];
      if (figure.from_median && !median) continue;
      figure.real_ns_per_iteration =
          run.GetAdjustedRealTime() / benchmark::GetTimeUnitMultiplier(run.time_unit) * 1e9;
      const auto events = run.counters.find("events");
      figure.events = events != run.counters.end() ? events->second.value : 0;
      figure.from_median = median;
    }
  }

  static std::string key(const std::string& function, const std::string& args,
                         std::int64_t threads) {
    return function + "/" + args + "/threads:" + std::to_string(threads);
  }

  std::optional<Figure> find(const std::string& function, const std::string& args = "",
                             std::int64_t threads = 1) const {
    const auto it = figures_.find(key(function, args, threads));
    if (it == figures_.end()) return std::nullopt;
    return it->second;
  }

 private:
  std::map<std::string, Figure> figures_;
};

const char* verdict(bool pass) { return pass ? "PASS" : "FAIL"; }

void print_cached(const RecordingReporter& reporter, const std::string& args) {
  const auto pool = reporter.find("BM_CachedAllocFree_Pool", args);
  const auto glibc = reporter.find("BM_CachedAllocFree_Malloc", args);
  if (pool && glibc) {
    std::printf("cached %s B, single thread: pool %.1f ns, malloc %.1f ns\n", args.c_str(),
                pool->real_ns_per_iteration, glibc->real_ns_per_iteration);
    std::printf("ratio pool/malloc (cached %s B): %.2f\n", args.c_str(),
                pool->real_ns_per_iteration / glibc->real_ns_per_iteration);
  }
  if (pool) {
    const bool pass = pool->real_ns_per_iteration <= kCachedTargetNs;
    std::printf("TARGET cached alloc+free %s B, 1 thread, median <= %.0f ns: %.1f ns  %s\n",
                args.c_str(), kCachedTargetNs, pool->real_ns_per_iteration, verdict(pass));
  }
}

// Per-thread rate with 2 threads over the rate with 1. The reported real time per
// iteration counts all threads' iterations, so one thread's time per operation is that
// figure times the number of threads.
std::optional<double> thread_rate_ratio(const RecordingReporter& reporter,
                                        const std::string& function, const std::string& args) {
  const auto one = reporter.find(function, args, 1);
  const auto two = reporter.find(function, args, 2);
  if (!one || !two) return std::nullopt;
  return one->real_ns_per_iteration / (two->real_ns_per_iteration * 2);
}

void print_threads(const RecordingReporter& reporter, const std::string& args) {
  const auto pool = thread_rate_ratio(reporter, "BM_CachedAllocFree_Pool_Threads", args);
  const auto glibc = thread_rate_ratio(reporter, "BM_CachedAllocFree_Malloc_Threads", args);
  if (glibc) {
    std::printf("per-thread rate with 2 threads / single-thread rate (malloc, %s B): %.2f\n",
                args.c_str(), *glibc);
  }
  if (pool) {
    std::printf("per-thread rate with 2 threads / single-thread rate (pool, %s B): %.2f\n",
                args.c_str(), *pool);
    std::printf(
        "TARGET 2 threads on 2 streams each keep >= %.0f %% of 1-thread rate (%s B): "
        "%.0f %%  %s\n",
        kThreadRateTarget * 100, args.c_str(), *pool * 100, verdict(*pool >= kThreadRateTarget));
  }
}

void print_trace(const RecordingReporter& reporter) {
  const auto pool = reporter.find("BM_Trace_Pool");
  const auto glibc = reporter.find("BM_Trace_Malloc");
  if (!pool || !glibc || pool->events <= 0 || glibc->events <= 0) return;
  const double pool_ns = pool->real_ns_per_iteration / pool->events;
  const double malloc_ns = glibc->real_ns_per_iteration / glibc->events;
  std::printf("trace replay (%.0f events): pool %.1f ns/op, malloc %.1f ns/op\n", pool->events,
              pool_ns, malloc_ns);
  std::printf("ratio pool/malloc (trace): %.2f\n", pool_ns / malloc_ns);
}

bool has_flag(const std::vector<char*>& args, std::string_view flag) {
  for (const char* arg : args) {
    if (std::string_view(arg).substr(0, flag.size()) == flag) return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> args(argv, argv + argc);
  std::string repetitions = "--benchmark_repetitions=" + std::to_string(kDefaultRepetitions);
  std::string aggregates_only = "--benchmark_display_aggregates_only=true";
  if (!has_flag(args, "--benchmark_repetitions")) {
    args.push_back(repetitions.data());
    if (!has_flag(args, "--benchmark_display_aggregates_only")) {
      args.push_back(aggregates_only.data());
    }
  }
  int count = static_cast<int>(args.size());
  args.push_back(nullptr);
  benchmark::Initialize(&count, args.data());
  if (benchmark::ReportUnrecognizedArguments(count, args.data())) return 1;

  RecordingReporter reporter(isatty(STDOUT_FILENO) != 0 ? benchmark::ConsoleReporter::OO_Defaults
                                                        : benchmark::ConsoleReporter::OO_Tabular);
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();

  std::printf("\n==== sdalloc_bench summary (medians; targets are informational) ====\n");
  for (const char* size : {"4096", "1048576"}) print_cached(reporter, size);
  for (const char* size : {"4096", "1048576"}) print_threads(reporter, size);
  print_trace(reporter);
  std::fflush(stdout);
  return 0;
}
