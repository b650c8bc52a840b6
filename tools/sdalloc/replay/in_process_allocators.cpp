// The in-process allocators of `sdalloc replay`: each owns its host memory, an optional
// LimitResource for --capacity / --min-capacity, and a StatsResource that measures what the
// allocator holds.
#include <memory>
#include <optional>
#include <string>

#include "replay/replay_target.hpp"
#include "sdalloc/policies/caching_pool.hpp"
#include "sdalloc/policies/planned_arena.hpp"
#include "sdalloc/policies/virtual_memory_pool.hpp"
#include "sdalloc/resources/host_resource.hpp"
#include "sdalloc/resources/host_virtual_memory.hpp"
#include "sdalloc/resources/limit_resource.hpp"
#include "sdalloc/resources/segments_only_resource.hpp"
#include "sdalloc/resources/stats_resource.hpp"
#include "sdalloc/resources/virtual_memory_resource.hpp"

namespace sdalloc::replay {
namespace {

// Host memory, capped when settings.capacity is set, seen as a device's (whole segments
// only: SegmentsOnlyResource) with settings.device_like, or as a device's virtual memory
// (chunks mapped into ranges: VirtualMemoryResource over the memfd) with settings.device_vm,
// counted by a StatsResource: the memory under every in-process target.
class MeasuredHostMemory {
 public:
  explicit MeasuredHostMemory(const TargetSettings& settings)
      : host_(HostResourceOptions{.transparent_huge_pages = settings.huge_pages}) {
    MemoryResource* under = &host_;
    if (settings.device_vm) under = &vm_ranges_.emplace(vm_.emplace());
    if (settings.capacity != 0) under = &limit_.emplace(*under, settings.capacity);
    if (settings.device_like) under = &segments_only_.emplace(*under);
    stats_ = std::make_unique<StatsResource>(*under);
  }
  MemoryResource& resource() { return *stats_; }
  std::uint64_t current() const { return stats_->stats().current_bytes; }
  std::uint64_t peak() const { return stats_->stats().peak_bytes; }

 private:
  HostResource host_;
  std::optional<HostVirtualMemory> vm_;
  std::optional<VirtualMemoryResource> vm_ranges_;
  std::optional<LimitResource> limit_;
  std::optional<SegmentsOnlyResource> segments_only_;
  std::unique_ptr<StatsResource> stats_;
};

CachingPoolOptions pool_options(const TargetSettings& settings) {
  CachingPoolOptions options = settings.pool;
  if (settings.pool_keep_cache) options.release_cached_before_growth = false;
  if (settings.pool_no_consolidation) options.consolidate_when_empty = false;
  return options;
}

class PoolTarget final : public ReplayTarget {
 public:
  explicit PoolTarget(const TargetSettings& settings)
      : memory_(settings), pool_(memory_.resource(), pool_options(settings)) {}
  MemoryResource& resource() override { return pool_; }
  std::uint64_t reserved_bytes() const override { return memory_.current(); }
  std::uint64_t peak_reserved_bytes() const override { return memory_.peak(); }
  std::string counters() const override {
    const PoolStats s = pool_.stats();
    std::string text = "segments +" + std::to_string(s.segment_allocations) + " -" +
                       std::to_string(s.segment_releases);
    // A split makes one range two, each released on its own (spare pages).
    if (s.segment_splits != 0) text += ", split " + std::to_string(s.segment_splits);
    if (s.arena_growths != 0) text += ", arena grown " + std::to_string(s.arena_growths);
    if (s.stitches != 0) text += ", stitched " + std::to_string(s.stitches);
    if (s.consolidations != 0) text += ", consolidated " + std::to_string(s.consolidations);
    return text;
  }

 private:
  MeasuredHostMemory memory_;
  CachingPool pool_;
};

class PlannedTarget final : public ReplayTarget {
 public:
  explicit PlannedTarget(const TargetSettings& settings)
      : memory_(settings), arena_(memory_.resource(), planned_options(settings)) {}
  MemoryResource& resource() override { return arena_; }
  void begin_pass() override { arena_.begin_step(); }
  void end_pass() override { arena_.end_step(); }
  std::uint64_t reserved_bytes() const override { return memory_.current(); }
  std::uint64_t peak_reserved_bytes() const override { return memory_.peak(); }
  std::string counters() const override {
    const PlannedArenaCounters c = arena_.counters();
    return "planned " + std::to_string(c.planned_allocations) + ", kept " +
           std::to_string(c.kept_allocations) + ", recorded " +
           std::to_string(c.recorded_allocations) + ", fallback " +
           std::to_string(c.fallback_allocations) + ", divergent steps " +
           std::to_string(c.divergent_steps);
  }

 private:
  static PlannedArenaOptions planned_options(const TargetSettings& settings) {
    PlannedArenaOptions options;
    options.fallback = pool_options(settings);
    options.prefault_host_arena = true;  // the arena is host memory, used whole every pass
    return options;
  }
  MeasuredHostMemory memory_;
  PlannedArena arena_;
};

// VirtualMemoryPool over HostVirtualMemory (memfd chunks mapped into reserved ranges). What
// it holds is its physical chunks, mapped or spare; --capacity caps them.
class VirtualMemoryTarget final : public ReplayTarget {
 public:
  explicit VirtualMemoryTarget(const TargetSettings& settings)
      : memory_(HostVirtualMemoryOptions{.move_mappings = !settings.vmm_no_moves}),
        pool_(memory_, VirtualMemoryPoolOptions{.max_physical_bytes = settings.capacity}) {}
  MemoryResource& resource() override { return pool_; }
  std::uint64_t reserved_bytes() const override { return pool_.vm_stats().physical_bytes; }
  std::uint64_t peak_reserved_bytes() const override {
    return pool_.vm_stats().peak_physical_bytes;
  }
  std::string counters() const override {
    const VirtualMemoryPoolStats s = pool_.vm_stats();
    return "maps " + std::to_string(s.maps) + ", unmaps " + std::to_string(s.unmaps) + ", moves " +
           std::to_string(s.moves) + ", pages moved " + std::to_string(s.remapped_pages) +
           ", chunks " + std::to_string(s.creates);
  }

 private:
  HostVirtualMemory memory_;
  VirtualMemoryPool pool_;
};

}  // namespace

const std::vector<InProcessAllocator>& in_process_allocators() {
  static const std::vector<InProcessAllocator> allocators = {
      {"pool", "sdalloc CachingPool over host memory",
       [](const TargetSettings& s) { return std::make_unique<PoolTarget>(s); }},
      {"planned", "sdalloc PlannedArena: pass 1 recorded, later passes served from a plan",
       [](const TargetSettings& s) { return std::make_unique<PlannedTarget>(s); }},
      {"vmm", "sdalloc VirtualMemoryPool: memfd pages mapped on demand, free pages moved",
       [](const TargetSettings& s) { return std::make_unique<VirtualMemoryTarget>(s); }},
  };
  return allocators;
}

}  // namespace sdalloc::replay
