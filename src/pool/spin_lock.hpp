// spin_lock.hpp - the lock that guards one pool shard (internal).
//
// A shard's critical sections are a few dozen instructions with no system call, so a
// test-and-test-and-set spin lock beats a mutex: taking it is one atomic exchange and
// releasing it one store, where std::mutex costs two atomic read-modify-writes and a call.
// Under contention it spins on a plain load (no cache-line ping-pong) and yields the CPU
// after a while, so an oversubscribed machine still makes progress. Meets BasicLockable.
#pragma once

#include <atomic>
#include <thread>

namespace sdalloc::detail {

class SpinLock {
 public:
  void lock() noexcept {
    for (unsigned spins = 0;; ++spins) {
      if (!locked_.exchange(true, std::memory_order_acquire)) return;
      while (locked_.load(std::memory_order_relaxed)) {
        if (++spins > 64) {
          std::this_thread::yield();
        } else {
          pause();
        }
      }
    }
  }
  bool try_lock() noexcept {
    return !locked_.load(std::memory_order_relaxed) &&
           !locked_.exchange(true, std::memory_order_acquire);
  }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  static void pause() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }

  std::atomic<bool> locked_{false};
};

}  // namespace sdalloc::detail
