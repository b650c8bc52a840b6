// arena_after_churn.hpp - the pool state the arena-growth tests start from.
//
// Two 6 MiB segments, freed, then 10 MiB: released to grow (churned), and after that request
// is freed the next allocation consolidates: one arena of the 12 MiB peak (an arena that can
// grow holds no headroom; one that cannot, 1/16 more: 14 MiB in 2 MiB steps). A 1 MiB block
// stays live at the arena's start. The pool takes 2 MiB segments from the start and keeps
// requests below 64 MiB in shared segments: arena_test_options().
// Used by tests/resources (host memory, VirtualMemoryResource) and tests/cuda (device memory).
#pragma once

#include <cstddef>

#include "sdalloc/policies/caching_pool.hpp"

namespace sdalloc::test {

inline CachingPoolOptions arena_test_options() {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  CachingPoolOptions options;
  options.small_pool_limit = 0;  // 2 MiB segments from the start
  options.huge_threshold = 64 * kMiB;
  return options;
}

// Runs the sequence on a fresh pool built with arena_test_options() (or options like them);
// answers the live 1 MiB block at the arena's start.
inline void* churn_into_arena(CachingPool& pool) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  void* a = pool.allocate(6 * kMiB);
  void* b = pool.allocate(6 * kMiB);
  pool.free(a);
  pool.free(b);
  pool.free(pool.allocate(10 * kMiB));
  return pool.allocate(kMiB);
}

}  // namespace sdalloc::test
