// sdalloc-pool-replay - replays an event trace through CachingPool(HostResource).
//
//     sdalloc-pool-replay [--capacity BYTES] [TRACE]
//
// Allocates and frees exactly what the trace says, on the streams it names, then prints the
// pool's statistics and how much more than the trace's live peak the pool had to reserve.
// TRACE is a CSV event trace, plain or gzip ("-" for standard input); without it the bundled
// SD 1.5 UNet trace is used. --capacity puts a LimitResource of that many bytes (suffixes
// K, M, G for KiB, MiB, GiB) under the pool, to ask whether the trace fits a smaller card.
// Exit status: 0 on success, 1 on a bad trace or out of memory, 2 on bad usage.
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "sdalloc/caching_pool.hpp"
#include "sdalloc/errors.hpp"
#include "sdalloc/event_trace.hpp"
#include "sdalloc/host_resource.hpp"
#include "sdalloc/limit_resource.hpp"
#include "sdalloc/pool_stats.hpp"

namespace {

constexpr const char* kUsage =
    "usage: sdalloc-pool-replay [--capacity BYTES[K|M|G]] [TRACE]\n"
    "  TRACE defaults to " SDALLOC_DEFAULT_TRACE "\n";

std::optional<std::size_t> parse_capacity(std::string_view text) {
  std::size_t shift = 0;
  if (!text.empty()) {
    const char unit = text.back();
    if (unit == 'K' || unit == 'k') shift = 10;
    if (unit == 'M' || unit == 'm') shift = 20;
    if (unit == 'G' || unit == 'g') shift = 30;
    if (shift != 0) text.remove_suffix(1);
  }
  std::size_t value = 0;
  const auto result = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || result.ec != std::errc() || result.ptr != text.data() + text.size() ||
      value == 0 || value > (SIZE_MAX >> shift)) {
    return std::nullopt;
  }
  return value << shift;
}

void replay(const sdalloc::EventTrace& trace, sdalloc::CachingPool& pool) {
  std::unordered_map<std::uint64_t, void*> live;
  live.reserve(trace.events.size() / 2 + 1);
  for (const sdalloc::TraceEvent& event : trace.events) {
    const sdalloc::Stream stream(static_cast<std::uintptr_t>(event.stream));
    if (event.op == sdalloc::TraceEvent::Op::kAlloc) {
      live[event.id] = pool.allocate(event.size, stream);
    } else {
      const auto it = live.find(event.id);  // the reader has checked that the id is live
      pool.deallocate(it->second, event.size, stream);
      live.erase(it);
    }
  }
  // Allocations the trace leaves live are returned when the pool is destroyed.
}

}  // namespace

int main(int argc, char** argv) {
  std::string path = SDALLOC_DEFAULT_TRACE;
  std::optional<std::size_t> capacity;
  bool have_path = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (arg == "--capacity") {
      capacity = i + 1 < argc ? parse_capacity(argv[++i]) : std::nullopt;
      if (!capacity) {
        std::fprintf(stderr, "sdalloc-pool-replay: --capacity needs a positive size\n%s", kUsage);
        return 2;
      }
    } else if (!have_path && (arg == "-" || !arg.starts_with("-"))) {
      path = arg;
      have_path = true;
    } else {
      std::fprintf(stderr, "sdalloc-pool-replay: unexpected argument '%s'\n%s", argv[i], kUsage);
      return 2;
    }
  }

  try {
    const sdalloc::EventTrace trace = sdalloc::read_event_trace(path);
    sdalloc::HostResource host;
    std::unique_ptr<sdalloc::LimitResource> limit;
    sdalloc::MemoryResource* upstream = &host;
    if (capacity) {
      limit = std::make_unique<sdalloc::LimitResource>(host, *capacity);
      upstream = limit.get();
    }
    sdalloc::CachingPool pool(*upstream);

    std::printf("trace:     %s\n", trace.source.c_str());
    std::printf("events:    %zu (%zu allocations)\n", trace.events.size(),
                trace.allocation_count());
    std::printf("peak live: %s\n", sdalloc::format_bytes(trace.peak_live_bytes()).c_str());
    std::printf("pool:      %s\n", pool.name().c_str());
    std::fflush(stdout);

    replay(trace, pool);
    const sdalloc::PoolStats stats = pool.stats();
    std::printf("\n%s\n", sdalloc::format_stats(stats).c_str());
    std::printf("peak reserved / peak live = %.3f\n", stats.peak_overhead_ratio());
    return 0;
  } catch (const sdalloc::TraceFormatError& error) {
    std::fprintf(stderr, "sdalloc-pool-replay: bad trace: %s\n", error.what());
  } catch (const sdalloc::OutOfMemory& error) {
    std::fprintf(stderr, "sdalloc-pool-replay: %s\n", error.what());
  } catch (const std::exception& error) {
    std::fprintf(stderr, "sdalloc-pool-replay: error: %s\n", error.what());
  }
  return 1;
}
