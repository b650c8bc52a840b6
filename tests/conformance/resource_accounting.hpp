// resource_accounting.hpp - what each resource's own counters must say, given the model.
//
// A configuration calls these at quiescent points (no call in flight) to compare what a
// layer reports about itself with what the test really holds:
//  - CachingPool: stats() agrees with the model (live bytes and count exactly; allocated,
//    reserved and peaks bounded as pool_stats.hpp defines them), every live pointer reports
//    its requested size, and check_invariants() passes.
//  - StatsResource: current bytes and count are what the caller holds from it.
//  - LimitResource: used() is what the caller holds from it.
//  - TraceResource: the CSV written so far is a valid event trace (parsed with the library's
//    own reader) whose live allocations add up to what the caller holds from it.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <unordered_map>

#include "conformance/reference_model.hpp"
#include "sdalloc/policies/any_pool.hpp"
#include "sdalloc/policies/caching_pool.hpp"
#include "sdalloc/resources/limit_resource.hpp"
#include "sdalloc/resources/stats_resource.hpp"
#include "sdalloc/resources/trace_resource.hpp"
#include "sdalloc/trace/event_trace.hpp"

namespace sdalloc::conformance {

// A pool's kept segment, where it has one (CachingPool's initial reservation).
inline std::size_t kept_bytes_of(const CachingPool& pool) {
  return pool.options().initial_reservation;
}
inline std::size_t kept_bytes_of(const AnyPool&) { return 0; }

// The consistency every PoolStats must show, whatever the pool holds.
template <typename P>
void expect_pool_stats_consistent(const PoolStats& s, const P& pool) {
  EXPECT_GE(s.allocated_bytes, s.live_bytes) << "rounding never shrinks a request";
  EXPECT_GE(s.reserved_bytes, s.allocated_bytes) << "blocks live inside reserved segments";
  EXPECT_EQ(s.free_bytes + s.spare_bytes, s.reserved_bytes - s.allocated_bytes)
      << "free + spare = reserved - allocated";
  EXPECT_LE(s.largest_free_block, s.free_bytes);
  EXPECT_GE(s.reserved_bytes, kept_bytes_of(pool))
      << "the initial reservation is kept until destruction";
  EXPECT_GE(s.peak_live_bytes, s.live_bytes);
  EXPECT_GE(s.peak_allocated_bytes, s.allocated_bytes);
  EXPECT_GE(s.peak_reserved_bytes, s.reserved_bytes);
  EXPECT_GE(s.peak_live_allocations, s.live_allocations);
  EXPECT_GE(s.peak_segments, s.segments);
  EXPECT_GE(s.peak_allocated_bytes, s.peak_live_bytes);
  EXPECT_GE(s.peak_reserved_bytes, s.peak_allocated_bytes);
  EXPECT_EQ(s.allocations - s.frees, s.live_allocations)
      << "allocations " << s.allocations << ", frees " << s.frees;
  EXPECT_EQ(s.segment_allocations - s.segment_releases, s.segments)
      << "segment allocations " << s.segment_allocations << ", releases " << s.segment_releases;
  EXPECT_EQ(s.segments == 0, s.reserved_bytes == 0);
}

template <typename P>
void expect_pool_matches(const P& pool, const ReferenceModel& model) {
  SCOPED_TRACE(pool.name());
  const PoolStats s = pool.stats();
  const LiveTotals& totals = model.totals();
  EXPECT_EQ(s.live_bytes, totals.bytes);
  EXPECT_EQ(s.live_allocations, totals.count);
  EXPECT_GE(s.allocated_bytes, totals.rounded_bytes)
      << "every request is rounded up to " << kPoolRounding << " bytes";
  // Host pools use HostStreamEvents: every event is complete at once, nothing is pending.
  EXPECT_EQ(s.pending_free_bytes, 0u);
  expect_pool_stats_consistent(s, pool);
  for (const auto& [address, entry] : model.live()) {
    const void* ptr = reinterpret_cast<const void*>(address);
    EXPECT_EQ(pool.allocation_size(ptr), entry.size) << "allocation_size(" << ptr << ")";
  }
  EXPECT_NO_THROW(pool.check_invariants());
}

inline void expect_stats_resource_matches(const StatsResource& stats, const LiveTotals& totals) {
  const ResourceStats s = stats.stats();
  EXPECT_EQ(s.current_bytes, totals.bytes) << stats.name();
  EXPECT_EQ(s.current_count, totals.count) << stats.name();
  EXPECT_GE(s.peak_bytes, s.current_bytes) << stats.name();
  EXPECT_GE(s.peak_count, s.current_count) << stats.name();
  EXPECT_EQ(s.allocations - s.deallocations, s.current_count) << stats.name();
}

inline void expect_limit_matches(const LimitResource& limit, std::size_t held_bytes) {
  EXPECT_EQ(limit.used(), held_bytes) << limit.name();
  EXPECT_LE(limit.used(), limit.capacity()) << limit.name();
}

// `out` is what `trace` writes to; `held` is what the caller of `trace` holds now.
inline void expect_trace_matches(TraceResource& trace, const std::ostringstream& out,
                                 const LiveTotals& held) {
  trace.flush();
  std::istringstream text(out.str());
  EventTrace parsed;
  ASSERT_NO_THROW(parsed = parse_event_trace(text, trace.name())) << "not a valid event trace";
  EXPECT_EQ(parsed.events.size(), trace.events()) << "events() counts the lines written";
  std::unordered_map<std::uint64_t, std::uint64_t> live;  // id -> size
  for (const TraceEvent& event : parsed.events) {
    if (event.op == TraceEvent::Op::kAlloc) {
      live.emplace(event.id, event.size);
    } else {
      live.erase(event.id);
    }
  }
  std::uint64_t live_bytes = 0;
  for (const auto& [id, size] : live) live_bytes += size;
  EXPECT_EQ(live_bytes, held.bytes) << "live bytes in the trace";
  EXPECT_EQ(live.size(), held.count) << "live allocations in the trace";
}

}  // namespace sdalloc::conformance
