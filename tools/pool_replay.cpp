// sdalloc-pool-replay - replays an event trace through CachingPool(HostResource).
//
//     sdalloc-pool-replay [TRACE] [--passes N] [--touch] [--capacity BYTES]
//                         [--keep-cache] [--no-consolidation] [--huge-pages]
//
// Allocates and frees exactly what the trace says, on the streams it names, N times over on
// one pool (the way a denoising loop repeats a step), then prints the pool's statistics and
// how much more than the trace's live peak the pool had to reserve. One line per pass shows
// its time and the system calls it needed, so the cost of growing and releasing is visible.
// TRACE is a CSV event trace, plain or gzip ("-" for standard input); without it the bundled
// SD 1.5 UNet trace is used. --capacity puts a LimitResource of that many bytes (suffixes
// K, M, G for KiB, MiB, GiB) under the pool, to ask whether the trace fits a smaller card.
// --touch writes one byte in every 4 KiB page of each allocation, as a tensor would be
// written, so page faults are part of the time.
// Exit status: 0 on success, 1 on a bad trace or out of memory, 2 on bad usage.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <unordered_map>

#include "sdalloc/caching_pool.hpp"
#include "sdalloc/errors.hpp"
#include "sdalloc/event_trace.hpp"
#include "sdalloc/host_resource.hpp"
#include "sdalloc/limit_resource.hpp"
#include "sdalloc/pool_stats.hpp"

namespace {

struct ReplayOptions {
  std::string path = SDALLOC_DEFAULT_TRACE;
  int passes = 1;
  bool touch = false;
  std::size_t capacity = 0;
  bool keep_cache = false;
  bool no_consolidation = false;
  bool huge_pages = false;
};

void touch_pages(void* ptr, std::size_t bytes) {
  auto* bytes_ptr = static_cast<volatile unsigned char*>(ptr);
  for (std::size_t offset = 0; offset < bytes; offset += 4096) bytes_ptr[offset] = 1;
}

void replay(const sdalloc::EventTrace& trace, sdalloc::CachingPool& pool, bool touch) {
  std::unordered_map<std::uint64_t, void*> live;
  live.reserve(trace.events.size() / 2 + 1);
  for (const sdalloc::TraceEvent& event : trace.events) {
    const sdalloc::Stream stream(static_cast<std::uintptr_t>(event.stream));
    if (event.op == sdalloc::TraceEvent::Op::kAlloc) {
      void* ptr = pool.allocate(event.size, stream);
      if (touch) touch_pages(ptr, event.size);
      live[event.id] = ptr;
    } else {
      const auto it = live.find(event.id);  // the reader has checked that the id is live
      pool.deallocate(it->second, event.size, stream);
      live.erase(it);
    }
  }
  // Allocations a trace leaves live stay live, as in the program that was recorded: a
  // later pass allocates its own.
}

int run(const ReplayOptions& options) {
  const sdalloc::EventTrace trace = sdalloc::read_event_trace(options.path);
  sdalloc::HostResource host(sdalloc::HostResourceOptions{.transparent_huge_pages =
                                                              options.huge_pages});
  std::unique_ptr<sdalloc::LimitResource> limit;
  sdalloc::MemoryResource* upstream = &host;
  if (options.capacity != 0) {
    limit = std::make_unique<sdalloc::LimitResource>(host, options.capacity);
    upstream = limit.get();
  }
  sdalloc::CachingPoolOptions pool_options;
  pool_options.release_cached_before_growth = !options.keep_cache;
  pool_options.consolidate_when_empty = !options.no_consolidation;
  sdalloc::CachingPool pool(*upstream, pool_options);

  const std::size_t peak_live = trace.peak_live_bytes();
  std::printf("trace:     %s\n", trace.source.c_str());
  std::printf("events:    %zu (%zu allocations)\n", trace.events.size(),
              trace.allocation_count());
  std::printf("peak live: %s\n", sdalloc::format_bytes(peak_live).c_str());
  std::printf("pool:      %s%s%s%s\n\n", pool.name().c_str(),
              options.keep_cache ? ", keep cache" : "",
              options.no_consolidation ? ", no consolidation" : "",
              options.touch ? ", pages touched" : "");
  std::fflush(stdout);

  sdalloc::PoolStats before = pool.stats();
  for (int pass = 1; pass <= options.passes; ++pass) {
    const auto start = std::chrono::steady_clock::now();
    replay(trace, pool, options.touch);
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    const sdalloc::PoolStats after = pool.stats();
    std::printf(
        "pass %d: %9.1f ms  %7.0f ns/event  peak reserved %s (x%.3f)  segment allocations "
        "+%llu, releases +%llu\n",
        pass, elapsed.count() * 1e3, elapsed.count() * 1e9 / double(trace.events.size()),
        sdalloc::format_bytes(after.peak_reserved_bytes).c_str(),
        double(after.peak_reserved_bytes) / double(peak_live),
        static_cast<unsigned long long>(after.segment_allocations - before.segment_allocations),
        static_cast<unsigned long long>(after.segment_releases - before.segment_releases));
    std::fflush(stdout);
    before = after;
  }
  const sdalloc::PoolStats stats = pool.stats();
  std::printf("\n%s\n", sdalloc::format_stats(stats).c_str());
  std::printf("peak reserved / peak live = %.3f\n", stats.peak_overhead_ratio());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  ReplayOptions options;
  CLI::App app{"Replays an allocation trace through sdalloc's CachingPool over host memory."};
  app.add_option("trace", options.path, "event trace CSV, plain or gzip; - for stdin")
      ->capture_default_str();
  app.add_option("--passes", options.passes, "replay the trace this many times on one pool")
      ->check(CLI::Range(1, 1000000));
  app.add_flag("--touch", options.touch, "write every 4 KiB page of each allocation");
  app.add_option("--capacity", options.capacity,
                 "cap the pool's memory like a device of this size (e.g. 2500M, 8G)")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::PositiveNumber);
  app.add_flag("--keep-cache", options.keep_cache,
               "never release cached segments before growing (release only on OOM)");
  app.add_flag("--no-consolidation", options.no_consolidation,
               "keep a churning stream's segments instead of merging them into one arena");
  app.add_flag("--huge-pages", options.huge_pages, "ask for transparent huge pages");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error) == 0 ? 0 : 2;
  }

  try {
    return run(options);
  } catch (const sdalloc::TraceFormatError& error) {
    std::fprintf(stderr, "sdalloc-pool-replay: bad trace: %s\n", error.what());
  } catch (const sdalloc::OutOfMemory& error) {
    std::fprintf(stderr, "sdalloc-pool-replay: %s\n", error.what());
  } catch (const std::exception& error) {
    std::fprintf(stderr, "sdalloc-pool-replay: error: %s\n", error.what());
  }
  return 1;
}
