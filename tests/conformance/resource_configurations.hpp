// resource_configurations.hpp - the resource stacks the conformance suite runs against.
//
// Each configuration is a small struct that builds one stack of resources (fresh for every
// test) and describes it to the tests:
//   kName                     readable name, used in the test names
//   resource()                the top of the stack: what the tests allocate from
//   kGuaranteedAlignment      what every result is aligned to (>= kMinAlignment)
//   kRejectsUnknownPointers   deallocate of a pointer that is not live throws InvalidPointer
//                             (pools, TraceResource); undefined behaviour for raw resources
//   kRejectsWrongSize         deallocate with another byte count throws InvalidArgument
//   kCapacity                 what resource().capacity() reports (0: unlimited)
//   kIsPool                   a CachingPool is in the stack: pool() returns it, and
//                             pool_options() are the options it was built with
//   expect_accounting(model)  compares every layer's own counters with the model
// Adding a configuration to AllConfigurations (and to PoolConfigurations for pools) gives it
// every test of the suite.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <sstream>
#include <string>

#include "conformance/reference_model.hpp"
#include "conformance/resource_accounting.hpp"
#include "sdalloc/policies/any_pool.hpp"
#include "sdalloc/policies/caching_pool.hpp"
#include "sdalloc/policies/planned_arena.hpp"
#include "sdalloc/policies/virtual_memory_pool.hpp"
#include "sdalloc/resources/host_resource.hpp"
#include "sdalloc/resources/host_virtual_memory.hpp"
#include "sdalloc/resources/limit_resource.hpp"
#include "sdalloc/resources/stats_resource.hpp"
#include "sdalloc/resources/trace_resource.hpp"
#include "support/sanitizers.hpp"

namespace sdalloc::conformance {

inline constexpr std::size_t kKiB = std::size_t{1} << 10;
inline constexpr std::size_t kMiB = std::size_t{1} << 20;
inline constexpr std::size_t kGiB = std::size_t{1} << 30;

// Capacity of the limited configurations: far above what the tests keep live (a few hundred
// MiB), small enough that exhausting it only maps (never touches) a few GiB.
inline constexpr std::size_t kLimitedCapacity = 8 * kGiB;

// Defaults shared by the traits below; configurations override what differs.
struct RawResourceTraits {
  static constexpr bool kIsPool = false;
  static constexpr bool kRejectsUnknownPointers = false;
  static constexpr bool kRejectsWrongSize = false;
  static constexpr std::size_t kCapacity = 0;
  static constexpr std::size_t kGuaranteedAlignment = HostResource::kPageSize;
};

struct PoolTraits {
  static constexpr bool kIsPool = true;
  static constexpr bool kRejectsUnknownPointers = true;
  static constexpr bool kRejectsWrongSize = true;
  static constexpr std::size_t kCapacity = 0;
  static constexpr std::size_t kGuaranteedAlignment = CachingPool::kRounding;
};

// ---- raw resources and adaptors over them --------------------------------------------------

struct HostConfig : RawResourceTraits {
  static constexpr const char* kName = "Host";
  MemoryResource& resource() { return host; }
  void expect_accounting(const ReferenceModel&) {}
  HostResource host;
};

struct HostHugePagesConfig : RawResourceTraits {
  static constexpr const char* kName = "HostHugePages";
  static constexpr std::size_t kGuaranteedAlignment = HostResource::kHugePageSize;
  MemoryResource& resource() { return host; }
  void expect_accounting(const ReferenceModel&) {}
  HostResource host{HostResourceOptions{.transparent_huge_pages = true}};
};

struct StatsOverHostConfig : RawResourceTraits {
  static constexpr const char* kName = "StatsOverHost";
  MemoryResource& resource() { return stats; }
  void expect_accounting(const ReferenceModel& model) {
    expect_stats_resource_matches(stats, model.totals());
  }
  HostResource host;
  StatsResource stats{host};
};

struct LimitOverHostConfig : RawResourceTraits {
  static constexpr const char* kName = "LimitOverHost";
  static constexpr std::size_t kCapacity = kLimitedCapacity;
  MemoryResource& resource() { return limit; }
  void expect_accounting(const ReferenceModel& model) {
    expect_limit_matches(limit, model.totals().bytes);
  }
  HostResource host;
  LimitResource limit{host, kLimitedCapacity};
};

struct TraceOverHostConfig : RawResourceTraits {
  static constexpr const char* kName = "TraceOverHost";
  static constexpr bool kRejectsUnknownPointers = true;  // trace_resource.hpp
  MemoryResource& resource() { return trace; }
  void expect_accounting(const ReferenceModel& model) {
    expect_trace_matches(trace, out, model.totals());
  }
  HostResource host;
  std::ostringstream out;
  TraceResource trace{host, out};
};

// ---- caching pools -------------------------------------------------------------------------

// A CachingPool straight over a HostResource, with the options `Options::make()` gives.
template <typename Options>
struct PoolOverHostConfig : PoolTraits {
  static constexpr const char* kName = Options::kName;
  static CachingPoolOptions pool_options() { return Options::make(); }
  MemoryResource& resource() { return caching_pool; }
  CachingPool& pool() { return caching_pool; }
  void expect_accounting(const ReferenceModel& model) { expect_pool_matches(caching_pool, model); }
  HostResource host;
  CachingPool caching_pool{host, pool_options()};
};

struct DefaultOptions {
  static constexpr const char* kName = "Pool";
  static CachingPoolOptions make() { return {}; }
};

struct InitialReservationOptions {
  static constexpr const char* kName = "PoolWithInitialReservation";
  static CachingPoolOptions make() { return {.initial_reservation = 64 * kMiB}; }
};

struct KeepCachedOnGrowthOptions {
  static constexpr const char* kName = "PoolKeepingCacheOnGrowth";
  static CachingPoolOptions make() { return {.release_cached_before_growth = false}; }
};

struct SmallSegmentsOptions {
  static constexpr const char* kName = "PoolWithSmallSegments";
  static CachingPoolOptions make() {
    return {.segment_granularity = 64 * kKiB, .min_segment_size = 64 * kKiB};
  }
};

// Requests from 1 MiB up take the huge path (own segments, close-size reuse only), so the
// random sequences exercise it constantly. (The threshold may not be below the granularity.)
struct SmallHugeThresholdOptions {
  static constexpr const char* kName = "PoolWithSmallHugeThreshold";
  static CachingPoolOptions make() {
    return {.segment_granularity = 1 * kMiB, .huge_threshold = 1 * kMiB};
  }
};

using PoolConfig = PoolOverHostConfig<DefaultOptions>;
using PoolWithInitialReservationConfig = PoolOverHostConfig<InitialReservationOptions>;
using PoolKeepingCacheOnGrowthConfig = PoolOverHostConfig<KeepCachedOnGrowthOptions>;
using PoolWithSmallSegmentsConfig = PoolOverHostConfig<SmallSegmentsOptions>;
using PoolWithSmallHugeThresholdConfig = PoolOverHostConfig<SmallHugeThresholdOptions>;

struct PoolOverLimitConfig : PoolTraits {
  static constexpr const char* kName = "PoolOverLimit";
  static constexpr std::size_t kCapacity = kLimitedCapacity;
  static CachingPoolOptions pool_options() { return {}; }
  MemoryResource& resource() { return caching_pool; }
  CachingPool& pool() { return caching_pool; }
  void expect_accounting(const ReferenceModel& model) {
    expect_pool_matches(caching_pool, model);
    expect_limit_matches(limit, caching_pool.stats().reserved_bytes);
  }
  HostResource host;
  LimitResource limit{host, kLimitedCapacity};
  CachingPool caching_pool{limit, pool_options()};
};

// A pool as the upstream of an adaptor: the adaptor sees what the application asked for.
struct StatsOverPoolConfig : PoolTraits {
  static constexpr const char* kName = "StatsOverPool";
  static CachingPoolOptions pool_options() { return {}; }
  MemoryResource& resource() { return stats; }
  CachingPool& pool() { return caching_pool; }
  void expect_accounting(const ReferenceModel& model) {
    expect_stats_resource_matches(stats, model.totals());
    expect_pool_matches(caching_pool, model);
  }
  HostResource host;
  CachingPool caching_pool{host, pool_options()};
  StatsResource stats{caching_pool};
};

// The trace under the pool records segments: its live allocations are the pool's reserve.
struct PoolOverTraceConfig : PoolTraits {
  static constexpr const char* kName = "PoolOverTrace";
  static CachingPoolOptions pool_options() { return {}; }
  MemoryResource& resource() { return caching_pool; }
  CachingPool& pool() { return caching_pool; }
  void expect_accounting(const ReferenceModel& model) {
    expect_pool_matches(caching_pool, model);
    const PoolStats s = caching_pool.stats();
    expect_trace_matches(trace, out, LiveTotals{s.reserved_bytes, s.segments, 0});
  }
  HostResource host;
  std::ostringstream out;
  TraceResource trace{host, out};
  CachingPool caching_pool{trace, pool_options()};
};

// ---- planned arenas ------------------------------------------------------------------------

// A PlannedArena inside a step that never ends, with no plan yet: every default-stream
// request is recorded under the arena's lock and served straight from the upstream
// (record_through_upstream); other streams go to the fallback pool.
struct PlannedArenaRecordingConfig : PoolTraits {
  static constexpr const char* kName = "PlannedArenaRecording";
  static constexpr bool kIsPool = false;  // the top of the stack is not a CachingPool
  PlannedArenaRecordingConfig() { arena.begin_step(); }
  MemoryResource& resource() { return arena; }
  void expect_accounting(const ReferenceModel& model) {
    const PoolStats s = arena.stats();
    EXPECT_EQ(s.live_bytes, model.totals().bytes);
    EXPECT_EQ(s.live_allocations, model.totals().count);
    EXPECT_GE(s.reserved_bytes, s.live_bytes);
    EXPECT_NO_THROW(arena.fallback_pool().check_invariants());
  }
  HostResource host;
  PlannedArena arena{host};
};

// The same with record_through_upstream off: the fallback pool serves the recording.
struct PlannedArenaRecordingThroughPoolConfig : PoolTraits {
  static constexpr const char* kName = "PlannedArenaRecordingThroughPool";
  static constexpr bool kIsPool = false;
  PlannedArenaRecordingThroughPoolConfig() { arena.begin_step(); }
  MemoryResource& resource() { return arena; }
  void expect_accounting(const ReferenceModel& model) {
    expect_pool_matches(arena.fallback_pool(), model);
    const PoolStats s = arena.stats();
    EXPECT_EQ(s.live_bytes, model.totals().bytes);
    EXPECT_EQ(s.live_allocations, model.totals().count);
  }
  static PlannedArenaOptions options() {
    PlannedArenaOptions o;
    o.record_through_upstream = false;
    return o;
  }
  HostResource host;
  PlannedArena arena{host, options()};
};

// The same as make_pool builds it where memory is virtual (arena_from_fallback): the fallback
// pool, a VirtualMemoryPool of 16 KiB pages with no growth slack, serves the recording.
struct PlannedArenaRecordingOverPagesConfig : PoolTraits {
  static constexpr const char* kName = "PlannedArenaRecordingOverPages";
  static constexpr bool kIsPool = false;
  PlannedArenaRecordingOverPagesConfig() { arena.begin_step(); }
  MemoryResource& resource() { return arena; }
  void expect_accounting(const ReferenceModel& model) {
    const PoolStats s = arena.stats();
    EXPECT_EQ(s.live_bytes, model.totals().bytes);
    EXPECT_EQ(s.live_allocations, model.totals().count);
    EXPECT_GE(s.reserved_bytes, s.live_bytes);
    EXPECT_EQ(s.reserved_bytes, arena.fallback_pool().stats().reserved_bytes);
    EXPECT_NO_THROW(arena.check_invariants());
  }
  static PlannedArenaOptions options() {
    PlannedArenaOptions o;
    o.arena_from_fallback = true;
    return o;
  }
  HostVirtualMemory memory;
  HostResource host;  // not used: the pages serve everything
  PlannedArena arena{host, options(), [this](MemoryResource&, const CachingPoolOptions&) {
                       VirtualMemoryPoolOptions vm;
                       vm.page_size = 16 * 1024;
                       vm.growth_slack = 0.0;
                       return std::make_unique<PoolOf<VirtualMemoryPool>>(memory, vm);
                     }};
};

// ---- pools over virtual memory -------------------------------------------------------------

// A VirtualMemoryPool over HostVirtualMemory. Its stats() are PoolStats too, with reserved =
// physical bytes held; the checks below are expect_pool_matches' where they apply, plus the
// VirtualMemory's own view of what is mapped and created.
template <typename Options>
struct VirtualMemoryPoolOverHostConfig : PoolTraits {
  static constexpr const char* kName = Options::kName;
  static constexpr std::size_t kCapacity = Options::make().max_physical_bytes;
  MemoryResource& resource() { return vm_pool; }
  VirtualMemoryPool& pool() { return vm_pool; }
  void expect_accounting(const ReferenceModel& model) {
    SCOPED_TRACE(vm_pool.name());
    const PoolStats s = vm_pool.stats();
    const LiveTotals& totals = model.totals();
    EXPECT_EQ(s.live_bytes, totals.bytes);
    EXPECT_EQ(s.live_allocations, totals.count);
    EXPECT_GE(s.allocated_bytes, totals.rounded_bytes);
    EXPECT_EQ(s.pending_free_bytes, 0u);
    EXPECT_GE(s.reserved_bytes, s.allocated_bytes) << "live blocks lie on mapped pages";
    EXPECT_EQ(s.free_bytes, s.reserved_bytes - s.allocated_bytes);
    EXPECT_LE(s.largest_free_block, s.free_bytes);
    EXPECT_GE(s.peak_live_bytes, s.live_bytes);
    EXPECT_GE(s.peak_reserved_bytes, s.reserved_bytes);
    EXPECT_EQ(s.allocations - s.frees, s.live_allocations);
    EXPECT_EQ(s.segment_allocations - s.segment_releases, s.segments);
    if (kCapacity != 0) {
      EXPECT_LE(s.peak_reserved_bytes, kCapacity);
    }
    const VirtualMemoryPoolStats v = vm_pool.vm_stats();
    EXPECT_EQ(v.physical_bytes, s.reserved_bytes);
    EXPECT_EQ(v.physical_bytes, memory.physical_bytes()) << "pool and memory agree";
    EXPECT_EQ(v.mapped_bytes, memory.mapped_bytes());
    EXPECT_EQ(v.address_space_bytes, memory.reserved_bytes());
    for (const auto& [address, entry] : model.live()) {
      const void* ptr = reinterpret_cast<const void*>(address);
      EXPECT_EQ(vm_pool.allocation_size(ptr), entry.size) << "allocation_size(" << ptr << ")";
    }
    EXPECT_NO_THROW(vm_pool.check_invariants());
  }
  HostVirtualMemory memory;
  VirtualMemoryPool vm_pool{memory, Options::make()};
};

struct DefaultVirtualMemoryOptions {
  static constexpr const char* kName = "VirtualMemoryPool";
  static constexpr VirtualMemoryPoolOptions make() { return {}; }
};

// A physical cap, like LimitResource's over a CachingPool; 2 MiB pages keep exhausting 8 GiB
// to a few thousand map calls.
struct CappedVirtualMemoryOptions {
  static constexpr const char* kName = "VirtualMemoryPoolCapped";
  static constexpr VirtualMemoryPoolOptions make() {
    return {.max_physical_bytes = kLimitedCapacity, .page_size = 2 * kMiB};
  }
};

// Every freed page is unmapped at once and every reuse maps again: the map paths all the time.
struct EagerUnmapVirtualMemoryOptions {
  static constexpr const char* kName = "VirtualMemoryPoolEagerUnmap";
  static constexpr VirtualMemoryPoolOptions make() { return {.eager_unmap = true}; }
};

using VirtualMemoryPoolConfig = VirtualMemoryPoolOverHostConfig<DefaultVirtualMemoryOptions>;
using VirtualMemoryPoolCappedConfig = VirtualMemoryPoolOverHostConfig<CappedVirtualMemoryOptions>;
using VirtualMemoryPoolEagerUnmapConfig =
    VirtualMemoryPoolOverHostConfig<EagerUnmapVirtualMemoryOptions>;

// What the suites read from either kind of pool.
inline std::size_t initial_reservation_of(const CachingPool& pool) {
  return pool.options().initial_reservation;
}
inline std::size_t initial_reservation_of(const VirtualMemoryPool&) { return 0; }

// ---- the lists the typed suites run over ---------------------------------------------------

using AllConfigurations = ::testing::Types<
    HostConfig, HostHugePagesConfig, StatsOverHostConfig, LimitOverHostConfig, TraceOverHostConfig,
    PoolConfig, PoolWithInitialReservationConfig, PoolKeepingCacheOnGrowthConfig,
    PoolWithSmallSegmentsConfig, PoolWithSmallHugeThresholdConfig, PoolOverLimitConfig,
    StatsOverPoolConfig, PoolOverTraceConfig, PlannedArenaRecordingConfig,
    PlannedArenaRecordingThroughPoolConfig, PlannedArenaRecordingOverPagesConfig,
    VirtualMemoryPoolConfig, VirtualMemoryPoolCappedConfig, VirtualMemoryPoolEagerUnmapConfig>;

using PoolConfigurations =
    ::testing::Types<PoolConfig, PoolWithInitialReservationConfig, PoolKeepingCacheOnGrowthConfig,
                     PoolWithSmallSegmentsConfig, PoolWithSmallHugeThresholdConfig,
                     PoolOverLimitConfig, StatsOverPoolConfig, PoolOverTraceConfig>;

// Test names read "ResourceConformance/PoolOverLimit.DoubleFreeIsRejected".
struct ConfigurationName {
  template <typename Config>
  static std::string GetName(int) {
    return Config::kName;
  }
};

// Sanitizer builds run the same tests with fewer operations: CI runs them on 2 cores, where
// page faults are slow (and slower under shadow memory). Raw resources get fewer still: each
// of their operations is an mmap, a munmap and page faults. Sanitizer builds also fill
// allocations larger than kWholeFillLimit sparsely (a span per MiB).
inline constexpr int kWorkDivisor = test::kAddressOrThreadSanitizer ? 4 : 1;
inline constexpr int kRawResourceDivisor = test::kAddressOrThreadSanitizer ? 2 : 1;
inline constexpr std::size_t kWholeFillLimit =
    test::kAddressOrThreadSanitizer ? 4 * kMiB : SIZE_MAX;

// How many operations a random test runs on `Config`, for `base` in the plain build.
template <typename Config>
constexpr int scaled_operations(int base) {
  return base / kWorkDivisor / (Config::kIsPool ? 1 : kRawResourceDivisor);
}

}  // namespace sdalloc::conformance
