// caching_pool_on_host.hpp - what the CachingPool tests share: a pool's upstream on host
// memory with its figures (StatsResource), the units, and the way to a consolidation.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>

#include "sdalloc/policies/caching_pool.hpp"
#include "sdalloc/resources/host_resource.hpp"
#include "sdalloc/resources/stats_resource.hpp"

namespace sdalloc::test {

inline constexpr std::size_t KiB = 1024;
inline constexpr std::size_t MiB = 1024 * KiB;

// The usual way to a consolidation: two segments of `unit` bytes, the first freed and
// released to grow past the peak for one of 1.5 x `unit` (a churn), then the stream empties,
// so that its next allocation makes one arena of the peak (2.5 x `unit`, plus the headroom).
inline void churn_to_an_empty_stream(CachingPool& pool, std::size_t unit) {
  void* a = pool.allocate(unit);
  void* b = pool.allocate(unit);
  pool.free(a);
  void* c = pool.allocate(unit + unit / 2);
  pool.free(b);
  pool.free(c);
}

class CachingPoolOnHost : public ::testing::Test {
 protected:
  HostResource host_;
  StatsResource upstream_{host_};
};

}  // namespace sdalloc::test
