// preload_runtime.hpp - the drop-in's one pool and everything around it, built on first use.
//
// The malloc entry points (malloc_entry.cpp) decide by size and by address whether a request
// is the pool's; the Runtime is what serves the pool's share. It is built by the first
// request at or above the smallest possible threshold, which may come before main() and
// before this library's own constructors ran, so it lives in static storage built in place
// (no static constructor can reset it later) and is never destroyed (other libraries'
// destructors may still free pool memory at exit).
//
// Building it reads SDALLOC_PRELOAD_CONF or else SDALLOC_CONF, reserves the address range, builds
// the pool with make_pool() over the range's memory (a RangeVirtualMemory: the default,
// mode:vmm, maps pages there; a RangeResource of segments: mode:pool and planned), starts the
// trace (record:) and registers the fork handlers. When any step fails it prints one line on stderr
// and the drop-in serves everything from the system allocator from then on.
//
// The caller (malloc_entry.cpp) marks the thread as inside sdalloc around every call here, so
// the mallocs sdalloc's own code makes go to glibc.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>

#include "preload/address_range.hpp"
#include "preload/fork_guard.hpp"
#include "preload/preload_config.hpp"
#include "preload/step_detector.hpp"
#include "preload/trace_hook.hpp"
#include "sdalloc/config/make_pool.hpp"
#include "sdalloc/policies/any_pool.hpp"

namespace sdalloc::preload {

// The smallest threshold: requests below it never build the runtime.
inline constexpr std::size_t kSmallestThreshold = std::size_t{4} << 10;

// What the report counts beside the pool's own statistics.
struct PreloadCounters {
  std::atomic<std::uint64_t> system_fallbacks{0};  // pool full: served by glibc instead
  std::atomic<std::uint64_t> zeroed_bytes{0};      // calloc bytes written with zeros
  std::atomic<std::uint64_t> fresh_bytes{0};       // calloc bytes left alone: fresh pages
  std::atomic<std::uint64_t> reallocs_moved{0};    // realloc calls that copied
};

class Runtime {
 public:
  // The runtime once built; nullptr while building (on this thread: a nested call) and
  // when the drop-in runs on the system allocator. Builds it on the first call.
  static Runtime* get();
  // The runtime if built, without building it.
  static Runtime* built();

  // The pool's share of malloc: nullptr when the pool is full (the caller then uses the
  // system allocator; the first time, one line on stderr says so). Other errors throw.
  void* allocate(std::size_t bytes, std::size_t alignment);
  // A pointer inside the range that is not a live allocation aborts with a message, as
  // glibc's free does.
  void free(void* ptr);
  std::size_t usable_size(const void* ptr);

  // Marks steps explicitly (sdalloc_preload_begin_step() / _end_step()): mode:planned only;
  // false otherwise, and for a begin inside a step or an end outside one. The first mark
  // switches automatic step detection off for good (ending a step it had begun).
  bool begin_step();
  bool end_step();

  const PreloadConfig& config() const { return config_; }
  PoolStats stats() const { return stack_->pool->stats(); }
  AnyPool& pool() { return *stack_->pool; }
  PreloadCounters& counters() { return counters_; }

  // The report text (report:), as written at exit.
  std::string report() const;
  // The same figures as one JSON object, written when the report path ends in ".json" (what
  // `sdalloc run` reads): mode, threshold_bytes, peak_live_bytes, peak_reserved_bytes,
  // pool_allocations, system_allocations (large requests the pool could not hold, served by
  // glibc), live_bytes_at_exit.
  std::string report_json() const;
  // At exit (the library's destructor): ends the trace and writes the report, in the process
  // that built the runtime only.
  void at_exit();

 private:
  Runtime() = default;
  // Builds everything; false (with the line printed) when the drop-in must stay off.
  bool build();
  void write_report() const;
  void stop_trace();
  // mode:planned without marks: tells the detector about a request and applies its answer
  // to the arena (steps_mutex_ held).
  void detect_step(std::size_t bytes);
  void apply(StepDetector::Action action);
  void stop_detection();

  static void at_fork_prepare();
  static void at_fork_parent();
  static void at_fork_child();

  PreloadConfig config_;
  ReservedRange range_;
  std::unique_ptr<PoolStack> stack_;  // the pool and the range's memory under it
  // mode:planned: finds the steps nobody marks (step_detector.hpp), until someone marks one.
  std::unique_ptr<StepDetector> steps_;
  std::atomic<bool> detecting_{false};
  std::mutex steps_mutex_;
  std::uint64_t divergent_at_begin_ = 0;
  TraceWriter trace_;
  std::atomic<bool> tracing_{false};
  ForkGuard fork_guard_;
  PreloadCounters counters_;
  std::atomic<bool> warned_full_{false};
  int pid_ = 0;  // the process that built it: a fork()ed child writes no report or trace
};

// What the entry points read on every call, valid before the runtime exists (constinit):
// the threshold, and the bounds of the reserved range.
extern constinit std::atomic<std::size_t> g_threshold;
extern constinit std::atomic<std::uintptr_t> g_range_base;
extern constinit std::atomic<std::size_t> g_range_size;

// The system allocator's share: one relaxed load (inlined into every entry point).
inline std::size_t current_threshold() { return g_threshold.load(std::memory_order_relaxed); }
// Whether ptr lies in the reserved range: one subtraction and one comparison.
inline bool owns(const void* ptr) {
  const auto offset =
      reinterpret_cast<std::uintptr_t>(ptr) - g_range_base.load(std::memory_order_relaxed);
  return offset < g_range_size.load(std::memory_order_relaxed);
}

}  // namespace sdalloc::preload
