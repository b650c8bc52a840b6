// ort_bench.cpp - sdalloc_ort_bench: one ONNX model, N runs, under one memory configuration;
// prints one JSON object (bench/onnxruntime/ort_bench.py runs every configuration in a fresh
// process each and makes the table).
//
// Configurations:
//   ort-default     ORT's CPU arena (kNextPowerOfTwo) + memory patterns: ORT's defaults
//   ort-arena-pow2  the arena (kNextPowerOfTwo), no memory patterns
//   ort-arena-same  an arena with kSameAsRequested (registered on the env), no patterns
//   ort-patterns    memory patterns, no arena (glibc malloc under them)
//   ort-plain       neither arena nor patterns (glibc malloc)
//   sdalloc-pool    sdalloc's CachingPool as the env allocator, no patterns
//   sdalloc-vmm     sdalloc's VirtualMemoryPool, no patterns
//   sdalloc-planned sdalloc's PlannedArena with planned_session_conf(), each Run() one
//                   step (PlannedSession), no patterns
//
// Measured the same way for all: peak RSS growth over the runs (VmHWM reset through
// /proc/self/clear_refs once the session is made, minus VmRSS then: pages first touched
// by the runs; memory the session's creation already touched and freed is not in it - see
// rss_session_bytes, the RSS the creation added, and rss_peak_bytes, the process's peak RSS
// from before the session was made to the end, weights included); the allocator's own figures where
// it has them (sdalloc's PoolStats; ORT arena's GetStats keys): bytes held at the peak over the
// runs beyond what was live before the first run, and the peak live bytes the same way (for sdalloc
// also the steady state: runs 2..N, after a plan exists, and what it holds after the last run,
// which a long-lived session keeps between requests); time per run (the first run apart; the
// mean of the others); the output's FNV-1a hash (equal bytes give equal hashes across
// configurations).
#include <onnxruntime_c_api.h>

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "onnxruntime/model_runner.hpp"
#include "sdalloc/config/make_pool.hpp"
#include "sdalloc/core/errors.hpp"
#include "sdalloc/onnxruntime/ort_allocator.hpp"
#include "sdalloc/onnxruntime/planned_run.hpp"
#include "sdalloc/resources/host_backend.hpp"
#include "sdalloc/resources/host_resource.hpp"

namespace so = sdalloc::onnxruntime;

namespace {

// A field of /proc/self/status in bytes ("VmRSS", "VmHWM").
std::int64_t proc_status_bytes(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string prefix = std::string(field) + ":";
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) == 0) return std::stoll(line.substr(prefix.size())) * 1024;
  }
  throw sdalloc::Error(std::string("no ") + field + " in /proc/self/status");
}

void reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  if (!out) throw sdalloc::Error("cannot reset the peak RSS (/proc/self/clear_refs)");
}

// Minor page faults of the process so far.
long minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

std::uint64_t fnv1a(const std::vector<std::uint8_t>& bytes) {
  std::uint64_t h = 1469598103934665603ULL;
  for (const std::uint8_t b : bytes) h = (h ^ b) * 1099511628211ULL;
  return h;
}

// An ORT allocator's GetStats value, or -1 when absent.
std::int64_t ort_stat(OrtAllocator* allocator, const char* key) {
  const OrtApi& api = so::ort_api();
  OrtKeyValuePairs* kvps = nullptr;
  so::throw_if_failed(api.AllocatorGetStats(allocator, &kvps), "AllocatorGetStats");
  const char* v = api.GetKeyValue(kvps, key);
  const std::int64_t value = v != nullptr ? std::stoll(v) : -1;
  api.ReleaseKeyValuePairs(kvps);
  return value;
}

struct Args {
  std::string models, model, config;
  int runs = 10;
  int threads = 1;
  // The segment granularity and smallest segment of sdalloc-pool's CachingPool and of
  // sdalloc-planned's fallback pool; 0: each one's default (CachingPoolOptions' 2 MiB, and
  // planned_session_conf()'s 4 KiB).
  std::size_t segment_kib = 0;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--models")
      a.models = v;
    else if (k == "--model")
      a.model = v;
    else if (k == "--config")
      a.config = v;
    else if (k == "--runs")
      a.runs = std::stoi(v);
    else if (k == "--threads")
      a.threads = std::stoi(v);
    else if (k == "--segment-kib")
      a.segment_kib = std::stoul(v);
    else
      throw sdalloc::InvalidArgument("unknown option " + k);
  }
  if (a.models.empty() || a.model.empty() || a.config.empty() || a.runs < 2) {
    throw sdalloc::InvalidArgument(
        "usage: sdalloc_ort_bench --models DIR --model NAME --config CONFIG [--runs N>=2] "
        "[--threads T] [--segment-kib K]");
  }
  return a;
}

int run(const Args& args) {
  const OrtApi& api = so::ort_api();
  OrtEnv* env = nullptr;
  so::throw_if_failed(api.CreateEnv(ORT_LOGGING_LEVEL_ERROR, "sdalloc-bench", &env), "CreateEnv");
  const so::Model model = so::read_model(args.models, args.model);
  const std::string& c = args.config;

  so::SessionSettings settings;
  settings.intra_op_threads = args.threads;
  std::unique_ptr<so::OrtPoolAllocator> allocator;
  std::unique_ptr<so::OrtEnvAllocator> registered;
  bool ort_arena_stats = false;
  if (c == "ort-default") {
    ort_arena_stats = true;
  } else if (c == "ort-arena-pow2") {
    settings.mem_pattern = false;
    ort_arena_stats = true;
  } else if (c == "ort-arena-same") {
    // ORT's arena with kSameAsRequested, shared through the env (the CPU EP's own arena
    // takes no extend strategy from the session options).
    const char* keys[] = {"arena_extend_strategy"};
    const std::size_t values[] = {1};
    OrtArenaCfg* cfg = nullptr;
    so::throw_if_failed(api.CreateArenaCfgV2(keys, values, 1, &cfg), "CreateArenaCfgV2");
    OrtMemoryInfo* info = nullptr;
    so::throw_if_failed(api.CreateCpuMemoryInfo(OrtArenaAllocator, OrtMemTypeDefault, &info),
                        "CreateCpuMemoryInfo");
    so::throw_if_failed(api.CreateAndRegisterAllocator(env, info, cfg), "register arena");
    api.ReleaseMemoryInfo(info);
    api.ReleaseArenaCfg(cfg);
    settings.mem_pattern = false;
    settings.env_allocators = true;
    ort_arena_stats = true;
  } else if (c == "ort-patterns") {
    settings.cpu_arena = false;
  } else if (c == "ort-plain") {
    settings.cpu_arena = false;
    settings.mem_pattern = false;
  } else if (c == "sdalloc-pool" || c == "sdalloc-vmm" || c == "sdalloc-planned") {
    sdalloc::PoolConf conf;
    if (c == "sdalloc-pool") conf.mode = sdalloc::PoolMode::kPool;
    if (c == "sdalloc-vmm") conf.mode = sdalloc::PoolMode::kVmm;
    if (c == "sdalloc-planned") conf = so::planned_session_conf();
    if (args.segment_kib != 0) {
      conf.pool.segment_granularity = args.segment_kib << 10;
      conf.pool.min_segment_size = args.segment_kib << 10;
    }
    std::shared_ptr<sdalloc::AnyPool> pool =
        sdalloc::share_pool(sdalloc::make_pool(conf, sdalloc::host_backend()));
    allocator = std::make_unique<so::OrtPoolAllocator>(pool);
    registered = std::make_unique<so::OrtEnvAllocator>(env, *allocator);
    settings.mem_pattern = false;
    settings.env_allocators = true;
  } else {
    throw sdalloc::InvalidArgument("unknown configuration " + c);
  }

  const std::int64_t rss_start = proc_status_bytes("VmRSS");
  std::optional<so::ModelRunner> runner;
  runner.emplace(env, model, settings);
  const std::int64_t rss_session = proc_status_bytes("VmRSS") - rss_start;
  // What the session's creation left cached goes back (OrtAllocator::Shrink, as a user would
  // after loading): the runs start from what is live.
  if (allocator) so::throw_if_failed(allocator->get()->Shrink(allocator->get()), "Shrink");
  std::unique_ptr<so::PlannedSession> planned;
  if (c == "sdalloc-planned")
    planned = std::make_unique<so::PlannedSession>(runner->session(), *allocator);

  // The session's own allocator, for the ORT arena's figures.
  OrtAllocator* ort_allocator = nullptr;
  OrtMemoryInfo* cpu_info = nullptr;
  if (ort_arena_stats) {
    so::throw_if_failed(api.CreateCpuMemoryInfo(OrtArenaAllocator, OrtMemTypeDefault, &cpu_info),
                        "CreateCpuMemoryInfo");
    so::throw_if_failed(api.CreateAllocator(runner->session(), cpu_info, &ort_allocator),
                        "CreateAllocator");
  }
  const std::int64_t ort_in_use_before = ort_allocator ? ort_stat(ort_allocator, "InUse") : -1;
  std::size_t live_before = 0, reserved_before = 0;
  if (allocator) {
    allocator->pool().reset_peak();
    live_before = allocator->stats().live_bytes;
    reserved_before = allocator->stats().reserved_bytes;
  }

  const std::int64_t creation_peak = proc_status_bytes("VmHWM");
  reset_peak_rss();
  const std::int64_t rss_before = proc_status_bytes("VmRSS");
  std::vector<double> ms;
  std::size_t steady_held = 0;
  std::size_t first_run_held = 0, first_run_live = 0;  // the pool's peaks in run 1, before reset
  long faults_after_first = 0;
  std::uint64_t hash = 0;
  bool equal = true;
  for (int i = 0; i < args.runs; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const so::RunResult r = runner->run(planned.get());
    const auto t1 = std::chrono::steady_clock::now();
    if (!r.error.empty()) throw sdalloc::Error("Run() failed: " + r.error);
    const std::uint64_t h = fnv1a(r.output);
    if (i == 0) hash = h;
    equal = equal && h == hash;
    ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    if (i == 0 && allocator) {  // the steady state is runs 2..N; held and live cover run 1 too
      const sdalloc::PoolStats s = allocator->stats();
      first_run_held = s.peak_reserved_bytes;
      first_run_live = s.peak_live_bytes;
      allocator->pool().reset_peak();
    }
    if (i == 0) faults_after_first = minor_faults();
  }
  if (allocator) steady_held = allocator->stats().peak_reserved_bytes - live_before;
  const std::int64_t runs_peak = proc_status_bytes("VmHWM");
  const std::int64_t rss_growth = runs_peak - rss_before;
  // The process's peak over its life (creation and runs), from before the session was made.
  const std::int64_t rss_peak = std::max(creation_peak, runs_peak) - rss_start;
  double rest = 0;
  for (std::size_t i = 1; i < ms.size(); ++i) rest += ms[i];
  rest /= static_cast<double>(ms.size() - 1);

  std::printf("{\"model\": \"%s\", \"config\": \"%s\", \"runs\": %d, \"threads\": %d, ",
              args.model.c_str(), c.c_str(), args.runs, args.threads);
  std::printf("\"rss_growth_bytes\": %lld, \"rss_session_bytes\": %lld, ",
              static_cast<long long>(rss_growth), static_cast<long long>(rss_session));
  std::printf("\"rss_peak_bytes\": %lld, ", static_cast<long long>(rss_peak));
  std::printf("\"first_run_ms\": %.3f, \"ms_per_run\": %.3f, ", ms[0], rest);
  std::printf(
      "\"faults_per_run\": %.1f, \"live_before_runs\": %zu, ",
      static_cast<double>(minor_faults() - faults_after_first) / static_cast<double>(args.runs - 1),
      live_before);
  std::printf("\"output_hash\": \"%016llx\", \"runs_equal\": %s",
              static_cast<unsigned long long>(hash), equal ? "true" : "false");
  if (allocator) {
    const sdalloc::PoolStats s = allocator->stats();
    std::printf(", \"peak_live_bytes\": %zu, \"held_bytes\": %zu, \"pool\": \"%s\"",
                std::max(first_run_live, s.peak_live_bytes) - live_before,
                std::max(first_run_held, s.peak_reserved_bytes) - live_before,
                allocator->pool().name().c_str());
    std::printf(", \"steady_held_bytes\": %zu, \"end_held_bytes\": %zu", steady_held,
                s.reserved_bytes - std::min(s.reserved_bytes, live_before));
    std::printf(", \"reserved_before_runs\": %zu, \"allocs\": %llu", reserved_before,
                static_cast<unsigned long long>(allocator->counters().allocs));
    if (planned) {
      const sdalloc::PlannedArenaCounters pc = planned->arena().counters();
      std::printf(", \"planned_steps\": %llu, \"divergent_steps\": %llu, \"arena_bytes\": %zu",
                  static_cast<unsigned long long>(pc.planned_steps),
                  static_cast<unsigned long long>(pc.divergent_steps),
                  planned->arena().planned_arena_size());
    }
  }
  if (ort_allocator != nullptr) {
    std::printf(
        ", \"peak_live_bytes\": %lld, \"held_bytes\": %lld, \"arena_extensions\": %lld",
        static_cast<long long>(ort_stat(ort_allocator, "MaxInUse") - ort_in_use_before),
        static_cast<long long>(ort_stat(ort_allocator, "TotalAllocated") - ort_in_use_before),
        static_cast<long long>(ort_stat(ort_allocator, "NumArenaExtensions")));
    api.ReleaseAllocator(ort_allocator);
    api.ReleaseMemoryInfo(cpu_info);
  }
  std::printf("}\n");
  planned.reset();
  runner.reset();
  registered.reset();
  allocator.reset();
  api.ReleaseEnv(env);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sdalloc_ort_bench: %s\n", e.what());
    return 1;
  }
}
