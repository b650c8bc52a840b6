// tools/sdalloc/replay/trace_player.hpp - one pass of a prepared trace through an allocator.
//
// The same loop replays the trace in this process (sdalloc's allocators) and in the child
// processes that measure the system allocators, so both are timed alike: allocate or free
// per event, optionally write every 4 KiB page of each allocation (--touch: page faults
// are part of what a real tensor costs), and every few events note the live bytes (the most
// since the previous sample, so peaks show) and the reserved bytes for the report's plot.
// Allocations the trace leaves live are freed after the pass, outside the timed part, so
// every pass starts from the same state and the trace's peak live bytes bound every pass.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "replay/prepared_trace.hpp"
#include "replay/progress_line.hpp"
#include "replay/replay_result.hpp"

namespace sdalloc::replay {

inline constexpr std::size_t kTouchStride = 4096;
inline constexpr std::size_t kSamplesPerPass = 250;

inline void touch_pages(void* ptr, std::uint64_t bytes) {
  auto* p = static_cast<volatile unsigned char*>(ptr);
  for (std::uint64_t offset = 0; offset < bytes; offset += kTouchStride) p[offset] = 1;
}

struct PassSettings {
  int pass = 0;  // 0-based
  int passes = 1;
  bool touch = false;
  std::vector<Sample>* samples = nullptr;  // nullptr: no samples
  ProgressLine* progress = nullptr;        // nullptr: no progress line
};

// Live pointers of a pass, by slot; what is still live when a pass stops (normally or by
// an exception) is released with release_live().
struct LiveSet {
  std::vector<void*> ptr;
  std::vector<std::uint64_t> bytes;
  std::vector<std::uint64_t> stream;

  explicit LiveSet(const PreparedTrace& trace)
      : ptr(trace.slots, nullptr), bytes(trace.slots, 0), stream(trace.slots, 0) {}

  template <typename Free>
  void release_live(Free&& free) {
    for (std::size_t k = 0; k < ptr.size(); ++k) {
      if (ptr[k] == nullptr) continue;
      void* p = ptr[k];
      ptr[k] = nullptr;
      free(p, bytes[k], stream[k]);
    }
  }
};

// Returns the wall-clock seconds of the pass. allocate(bytes, stream) -> void*,
// free(ptr, bytes, stream), reserved() -> bytes held now (only called when sampling).
// Exceptions from allocate propagate; `live` then holds what must be released.
template <typename Allocate, typename Free, typename Reserved>
double play_pass(const PreparedTrace& trace, LiveSet& live, const PassSettings& settings,
                 Allocate&& allocate, Free&& free, Reserved&& reserved) {
  const std::size_t n = trace.events.size();
  const std::size_t every = n / kSamplesPerPass + 1;
  const std::uint64_t first_event = std::uint64_t(settings.pass) * n;
  std::uint64_t live_bytes = 0;
  std::uint64_t live_peak_since_sample = 0;  // so the plot shows peaks between samples
  std::size_t next_sample = 0;
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < n; ++i) {
    const PreparedEvent& e = trace.events[i];
    if (e.is_alloc) {
      void* p = allocate(e.size, e.stream);
      if (settings.touch && p != nullptr) touch_pages(p, e.size);
      live.ptr[e.slot] = p;
      live.bytes[e.slot] = e.size;
      live.stream[e.slot] = e.stream;
      live_bytes += e.size;
      live_peak_since_sample = std::max(live_peak_since_sample, live_bytes);
    } else {
      void* p = live.ptr[e.slot];
      live.ptr[e.slot] = nullptr;
      free(p, e.size, e.stream);
      live_bytes -= e.size;
    }
    if (i == next_sample || i + 1 == n) {
      next_sample += every;
      if (settings.samples != nullptr) {
        settings.samples->push_back(
            Sample{first_event + i, std::max(live_peak_since_sample, live_bytes), reserved()});
      }
      live_peak_since_sample = 0;
      if (settings.progress != nullptr) {
        settings.progress->update_now(settings.pass + 1, settings.passes, i, n);
      }
    }
  }
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  live.release_live(free);
  return elapsed.count();
}

}  // namespace sdalloc::replay
