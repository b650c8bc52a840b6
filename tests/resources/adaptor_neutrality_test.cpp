// adaptor_neutrality_test.cpp - an adaptor between a pool and its memory changes nothing the
// pool decides.
//
// A MemoryResource is two functions (allocate, deallocate) with a capacity and a name; the
// adaptors (TraceResource, StatsResource, LimitResource without a limit) forward them. A pool
// must therefore take, release and consolidate exactly the same segments over an adaptor as
// over the memory itself: a recorded trace replayed through pool(X) and pool(Adaptor(X)) gives
// the same footprint and the same counts. (Before 0.2 the resource also carried page
// operations that TraceResource did not forward, so tracing changed the policy.)
#include <gtest/gtest.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "sdalloc/core/pool_stats.hpp"
#include "sdalloc/policies/caching_pool.hpp"
#include "sdalloc/resources/host_resource.hpp"
#include "sdalloc/resources/limit_resource.hpp"
#include "sdalloc/resources/stats_resource.hpp"
#include "sdalloc/resources/trace_resource.hpp"
#include "sdalloc/trace/event_trace.hpp"

namespace sdalloc {
namespace {

// Replays `trace` `passes` times through `pool` and answers its figures at the end.
PoolStats replay(CachingPool& pool, const EventTrace& trace, int passes) {
  for (int pass = 0; pass < passes; ++pass) {
    std::unordered_map<std::uint64_t, void*> live;
    for (const TraceEvent& e : trace.events) {
      const Stream stream{static_cast<std::uintptr_t>(e.stream)};
      if (e.op == TraceEvent::Op::kAlloc) {
        live[e.id] = pool.allocate(e.size, stream);
      } else {
        pool.deallocate(live.at(e.id), e.size, stream);
        live.erase(e.id);
      }
    }
    for (const auto& [id, ptr] : live) pool.free(ptr);
  }
  pool.check_invariants();
  return pool.stats();
}

struct Figures {
  std::size_t peak_reserved;
  std::size_t reserved;
  std::uint64_t segment_allocations;
  std::uint64_t segment_releases;
  std::uint64_t consolidations;
  std::size_t peak_segments;
  bool operator==(const Figures&) const = default;
};

Figures figures_of(const PoolStats& s) {
  return {s.peak_reserved_bytes, s.reserved_bytes, s.segment_allocations,
          s.segment_releases,    s.consolidations, s.peak_segments};
}

std::ostream& operator<<(std::ostream& out, const Figures& f) {
  return out << "peak reserved " << f.peak_reserved << ", reserved " << f.reserved << ", segments +"
             << f.segment_allocations << " -" << f.segment_releases << ", consolidations "
             << f.consolidations << ", peak segments " << f.peak_segments;
}

class AdaptorNeutrality : public ::testing::TestWithParam<std::string> {};

TEST_P(AdaptorNeutrality, APoolDecidesTheSameOverEveryAdaptor) {
  const EventTrace trace =
      read_event_trace(std::string(SDALLOC_DATA_DIR) + "/traces/" + GetParam());
  constexpr int kPasses = 3;
  HostResource host;
  const auto over = [&](MemoryResource& memory) {
    CachingPool pool(memory);
    return figures_of(replay(pool, trace, kPasses));
  };
  const Figures plain = over(host);
  ASSERT_GT(plain.segment_allocations, 0u);

  std::ostringstream log;
  TraceResource traced(host, log);
  EXPECT_EQ(over(traced), plain) << "TraceResource";
  EXPECT_NE(log.str().find('\n'), std::string::npos) << "the trace was written";

  StatsResource counted(host);
  EXPECT_EQ(over(counted), plain) << "StatsResource";
  EXPECT_EQ(counted.stats().peak_bytes, plain.peak_reserved);

  LimitResource unlimited(host, LimitResource::kNoLimit);
  EXPECT_EQ(over(unlimited), plain) << "LimitResource";

  TraceResource traced_over_stats(counted, log);  // adaptors stack
  EXPECT_EQ(over(traced_over_stats), plain) << "TraceResource over StatsResource";
}

// A classifier (many small blocks, consolidations) and a VAE decoder (few large blocks).
INSTANTIATE_TEST_SUITE_P(Traces, AdaptorNeutrality,
                         ::testing::Values("rec_tv_resnet18_b1_224.csv", "rec_vae_b1_8x8.csv"));

}  // namespace
}  // namespace sdalloc
