// report_fixture.cpp - writes an HTML report of a made-up replay run, for the browser test.
//
//     sdalloc_report_fixture <trace.csv> <report.html> [passes]
//
// The run has the real trace (its events, peak live bytes, live bytes at every sample, size
// histogram) and three allocators whose reserved bytes follow simple rules instead of being
// measured: "pool" keeps every 2 MiB segment it ever needed, "glibc" holds an eighth more
// than live, "vmm" did not run. Its figures are synthetic and say so in the report: this
// program exists to give render-report-in-chromium.py a realistic page to render (several
// plots, a failed row with markup in its problem text), not to measure anything.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>

#include "replay/html_report.hpp"
#include "replay/replay_result.hpp"
#include "sdalloc/trace/event_trace.hpp"

namespace {

using sdalloc::replay::AllocatorResult;
using sdalloc::replay::ReplayRun;
using sdalloc::replay::Sample;

constexpr std::uint64_t kSegment = 2ULL << 20;

sdalloc::replay::ReplayRun synthetic_run(const sdalloc::EventTrace& trace, int passes) {
  ReplayRun run;
  run.trace = trace.source;
  run.events = trace.events.size();
  run.allocations = trace.allocation_count();
  run.peak_live = trace.peak_live_bytes();
  run.passes = passes;

  AllocatorResult pool;
  pool.allocator = "pool";
  pool.description = "synthetic: keeps every 2 MiB segment it needed";
  pool.ran = true;
  AllocatorResult glibc;
  glibc.allocator = "glibc";
  glibc.description = "synthetic: an eighth more than live";
  glibc.ran = true;
  AllocatorResult vmm;
  vmm.allocator = "vmm";
  vmm.description = "synthetic: virtual-memory pool";
  vmm.problem = "<no CUDA driver> & no device: install libcuda.so.1 \"here\"";

  // One sample per window of `every` events, at the window's last event with its highest
  // bytes, so short peaks show in the plot as they would from a driver that tracks maxima.
  const std::uint64_t every = std::max<std::uint64_t>(1, run.events / 400);
  std::uint64_t live = 0;
  std::uint64_t pool_reserved = 0;
  std::uint64_t window_live = 0;
  for (int pass = 0; pass < passes; ++pass) {
    for (std::uint64_t i = 0; i < run.events; ++i) {
      const sdalloc::TraceEvent& event = trace.events[i];
      live = event.op == sdalloc::TraceEvent::Op::kAlloc ? live + event.size : live - event.size;
      pool_reserved = std::max(pool_reserved, (live + kSegment - 1) / kSegment * kSegment);
      window_live = std::max(window_live, live);
      if ((i + 1) % every != 0 && i + 1 != run.events) continue;
      const std::uint64_t at = static_cast<std::uint64_t>(pass) * run.events + i;
      pool.samples.push_back({at, window_live, pool_reserved});
      glibc.samples.push_back({at, window_live, window_live + window_live / 8});
      window_live = live;
    }
    live = 0;  // the driver frees what a trace leaves live at the end of each pass
    window_live = 0;
    pool.pass_seconds.push_back(0.010 + 0.001 * pass);
    glibc.pass_seconds.push_back(0.020 + 0.001 * pass);
  }
  for (AllocatorResult* result : {&pool, &glibc}) {
    for (const Sample& sample : result->samples) {
      result->peak_reserved = std::max(result->peak_reserved, sample.reserved_bytes);
    }
    result->ratio = run.peak_live == 0 ? 0
                                       : static_cast<double>(result->peak_reserved) /
                                             static_cast<double>(run.peak_live);
    result->ns_per_op = 1e9 * result->pass_seconds.front() / static_cast<double>(run.events);
    result->counters = "synthetic figures, for the rendering test";
  }
  pool.min_capacity = pool.peak_reserved;
  run.results = {pool, vmm, glibc};
  return run;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || argc > 4) {
    std::fprintf(stderr, "usage: %s <trace.csv> <report.html> [passes]\n", argv[0]);
    return 2;
  }
  try {
    const int passes = argc == 4 ? std::stoi(argv[3]) : 2;
    if (passes < 1) throw std::invalid_argument("passes must be at least 1");
    const sdalloc::EventTrace trace = sdalloc::read_event_trace(argv[1]);
    sdalloc::replay::write_html_report(synthetic_run(trace, passes), trace, argv[2]);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "%s: %s\n", argv[0], error.what());
    return 1;
  }
  return 0;
}
