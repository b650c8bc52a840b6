// fork_guard.hpp - keeps fork() from copying a pool lock held by another thread.
//
// A child of fork() has one thread; a lock another thread held in the parent stays locked in
// the child forever. So every call into the pool holds ForkGuard shared, and the atfork
// prepare handler takes it exclusively: fork() then happens while no thread is inside the
// pool, and the child starts with every pool lock free. Only large requests take it, so the
// cost (one atomic add and one atomic sub) is noise beside what they do.
//
// The writer announces itself first (kPending), so a stream of large requests from other
// threads cannot starve a fork(); a shared holder must therefore not take it again (the
// drop-in never does: every call made from inside sdalloc goes to glibc). Plain atomics, no
// pthread objects: the child just stores 0.
#pragma once

#include <sched.h>

#include <atomic>

namespace sdalloc::preload {

class ForkGuard {
 public:
  void lock_shared() {
    int seen = state_.load(std::memory_order_relaxed);
    for (;;) {
      if (seen >= 0 && (seen & kPending) == 0) {
        if (state_.compare_exchange_weak(seen, seen + 1, std::memory_order_acquire,
                                         std::memory_order_relaxed)) {
          return;
        }
        continue;
      }
      sched_yield();
      seen = state_.load(std::memory_order_relaxed);
    }
  }
  void unlock_shared() { state_.fetch_sub(1, std::memory_order_release); }

  void lock() {
    state_.fetch_or(kPending, std::memory_order_relaxed);
    int expected = kPending;
    while (!state_.compare_exchange_weak(expected, kHeld, std::memory_order_acquire,
                                         std::memory_order_relaxed)) {
      expected = kPending;
      sched_yield();
    }
  }
  void unlock() { state_.store(0, std::memory_order_release); }
  // In the child of fork(): only the forking thread exists, and it held the guard.
  void reset() { state_.store(0, std::memory_order_relaxed); }

 private:
  static constexpr int kPending = 1 << 30;  // a writer waits: no new shared holders
  static constexpr int kHeld = -1;
  std::atomic<int> state_{0};  // low bits: shared holders; kHeld: held exclusively
};

class SharedForkGuard {
 public:
  explicit SharedForkGuard(ForkGuard& guard) : guard_(guard) { guard_.lock_shared(); }
  ~SharedForkGuard() { guard_.unlock_shared(); }
  SharedForkGuard(const SharedForkGuard&) = delete;
  SharedForkGuard& operator=(const SharedForkGuard&) = delete;

 private:
  ForkGuard& guard_;
};

}  // namespace sdalloc::preload
