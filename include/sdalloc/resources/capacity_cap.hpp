// sdalloc/resources/capacity_cap.hpp - a running total of bytes handed out, kept under a limit.
//
// The one compare-exchange loop behind LimitResource (whose cap may change while in use:
// the PyTorch shim's memory fraction); public because LimitResource holds one, and usable
// by any adaptor that caps bytes. try_reserve() takes bytes
// only if the total stays within the limit; concurrent callers can never pass the limit
// together, because the check and the update are one compare-exchange. release() gives
// bytes back. Lowering the limit below what is in use takes nothing back: later requests
// fail until enough is released.
//
// Invariants: used() is the sum of granted reservations minus releases; a refused
// reservation changes nothing. kNoLimit (the largest size) means no cap: a request is then
// refused only when the total would overflow. Thread-safe and lock-free; relaxed atomics
// suffice because the total orders nothing but itself.
#pragma once

#include <atomic>
#include <cstddef>
#include <limits>

namespace sdalloc {

class CapacityCap {
 public:
  static constexpr std::size_t kNoLimit = std::numeric_limits<std::size_t>::max();

  // What try_reserve saw: whether the bytes were granted, and the total in use and the
  // limit it compared against (for the caller's error message when refused).
  struct Reservation {
    bool granted = false;
    std::size_t used = 0;
    std::size_t limit = 0;
    explicit operator bool() const { return granted; }
  };

  explicit CapacityCap(std::size_t limit) : limit_(limit) {}

  Reservation try_reserve(std::size_t bytes) {
    std::size_t used = used_.load(std::memory_order_relaxed);
    for (;;) {
      const std::size_t limit = limit_.load(std::memory_order_relaxed);
      if (used > limit || bytes > limit - used) return {false, used, limit};
      if (used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed)) {
        return {true, used + bytes, limit};
      }
    }
  }
  // Gives back bytes of a granted reservation.
  void release(std::size_t bytes) { used_.fetch_sub(bytes, std::memory_order_relaxed); }

  void set_limit(std::size_t limit) { limit_.store(limit, std::memory_order_relaxed); }
  std::size_t limit() const { return limit_.load(std::memory_order_relaxed); }
  std::size_t used() const { return used_.load(std::memory_order_relaxed); }

 private:
  std::atomic<std::size_t> limit_;
  std::atomic<std::size_t> used_{0};
};

}  // namespace sdalloc
