// pool_counters.hpp - pool-wide figures shared by all shards (internal).
//
// A Gauge is a current value with its high-water mark. Segments are counted while the
// owning shard's lock is held, so with every shard locked (check_invariants) the figures
// agree exactly with the segments. The peak is raised with compare-exchange only when the current
// value passes it, so in a steady state an update is one atomic add and two loads. The peak
// is a figure (reset_peak starts a new one); high() is the highest value ever, which a pool's
// policy may use: measuring must not change what the pool does.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace sdalloc::detail {

class Gauge {
 public:
  void add(std::size_t n) {
    const std::size_t now = current_.fetch_add(n, std::memory_order_relaxed) + n;
    // high >= peak always: a value that does not pass the peak cannot pass the high mark,
    // and one that another thread's raise beat is raised to the high by that thread.
    if (raise(peak_, now)) raise(high_, now);
  }
  void sub(std::size_t n) { current_.fetch_sub(n, std::memory_order_relaxed); }
  std::size_t current() const { return current_.load(std::memory_order_relaxed); }
  std::size_t peak() const { return peak_.load(std::memory_order_relaxed); }
  std::size_t high() const { return high_.load(std::memory_order_relaxed); }
  void reset_peak() { peak_.store(current(), std::memory_order_relaxed); }

 private:
  // Raises `mark` to `now`; false when it was already as high.
  static bool raise(std::atomic<std::size_t>& mark, std::size_t now) {
    std::size_t seen = mark.load(std::memory_order_relaxed);
    while (now > seen) {
      if (mark.compare_exchange_weak(seen, now, std::memory_order_relaxed)) return true;
    }
    return false;
  }

  std::atomic<std::size_t> current_{0};
  std::atomic<std::size_t> peak_{0};
  std::atomic<std::size_t> high_{0};
};

// Figures that change only on the slow path (segments come and go), shared by all shards.
// Per-call figures (live bytes, counts) are per shard: see ShardFigures in pool_shard.hpp.
struct PoolCounters {
  Gauge reserved_bytes;  // segment bytes held from the resource
  Gauge segments;
  std::atomic<std::uint64_t> segment_allocations{0};
  std::atomic<std::uint64_t> segment_releases{0};
  std::atomic<std::uint64_t> failed_releases{0};  // deallocate calls the resource refused
  std::atomic<std::uint64_t> consolidations{0};
  // oom_retries and ooms are the core's (stream_ordered_core.hpp), as every pool has them.
};

}  // namespace sdalloc::detail
