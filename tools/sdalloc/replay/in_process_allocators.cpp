// The in-process allocators of `sdalloc replay`: sdalloc's modes, each a pool built by
// make_pool() (the one place pools are built) over a measured host backend
// (measured_backend.hpp), which counts every byte the system hands out.
#include <memory>
#include <string>
#include <utility>

#include "replay/measured_backend.hpp"
#include "replay/replay_target.hpp"
#include "replay/torch_replay_targets.hpp"
#include "sdalloc/config/make_pool.hpp"
#include "sdalloc/policies/planned_arena.hpp"
#include "sdalloc/policies/virtual_memory_pool.hpp"

namespace sdalloc::replay {
namespace {

class PoolTarget final : public ReplayTarget {
 public:
  PoolTarget(PoolMode mode, const TargetSettings& settings)
      : held_(std::make_shared<HeldBytes>()), stack_(build(mode, settings, held_)) {}
  MemoryResource& resource() override { return pool_resource_; }
  void begin_pass() override {
    if (PlannedArena* arena = stack_->pool->planned()) arena->begin_step();
  }
  void end_pass() override {
    if (PlannedArena* arena = stack_->pool->planned()) arena->end_step();
  }
  std::uint64_t reserved_bytes() const override {
    return held_->current.load(std::memory_order_relaxed);
  }
  std::uint64_t peak_reserved_bytes() const override {
    return held_->peak.load(std::memory_order_relaxed);
  }
  std::string counters() const override {
    if (VirtualMemoryPool* vmm = stack_->pool->vmm()) {
      const VirtualMemoryPoolStats s = vmm->vm_stats();
      return "maps " + std::to_string(s.maps) + ", unmaps " + std::to_string(s.unmaps) +
             ", moves " + std::to_string(s.moves) + ", pages moved " +
             std::to_string(s.remapped_pages) + ", chunks " + std::to_string(s.creates);
    }
    if (PlannedArena* arena = stack_->pool->planned()) {
      const PlannedArenaCounters c = arena->counters();
      return "planned " + std::to_string(c.planned_allocations) + ", kept " +
             std::to_string(c.kept_allocations) + ", recorded " +
             std::to_string(c.recorded_allocations) + ", fallback " +
             std::to_string(c.fallback_allocations) + ", divergent steps " +
             std::to_string(c.divergent_steps);
    }
    const PoolStats s = stack_->pool->stats();
    std::string text = "segments +" + std::to_string(s.segment_allocations) + " -" +
                       std::to_string(s.segment_releases);
    if (s.consolidations != 0) text += ", consolidated " + std::to_string(s.consolidations);
    return text;
  }
  std::uint64_t memory_calls() const override {
    VirtualMemoryPool* vmm = stack_->pool->vmm();
    // A planned arena over virtual memory takes its pages (and its arenas) from a
    // VirtualMemoryPool: its calls are that pool's.
    if (PlannedArena* arena = stack_->pool->planned()) vmm = arena->fallback_pool().vmm();
    if (vmm != nullptr) {
      const VirtualMemoryPoolStats s = vmm->vm_stats();
      return s.maps + s.unmaps + s.moves;
    }
    const PoolStats s = stack_->pool->stats();
    return s.segment_allocations + s.segment_releases;
  }

 private:
  static std::unique_ptr<PoolStack> build(PoolMode mode, const TargetSettings& settings,
                                          const std::shared_ptr<HeldBytes>& held) {
    PoolConf conf;
    conf.mode = mode;
    conf.capacity = settings.capacity;
    conf.pool = settings.pool;
    if (settings.pool_keep_cache) conf.pool.release_cached_before_growth = false;
    if (settings.pool_no_consolidation) conf.pool.consolidate_when_empty = false;
    return make_pool(conf, measured_host_backend({.huge_pages = settings.huge_pages,
                                                  .device_like = settings.device_like,
                                                  .virtual_memory_moves = !settings.vmm_no_moves},
                                                 held));
  }

  // The AnyPool as the MemoryResource the replay allocates from.
  class AsResource final : public MemoryResource {
   public:
    explicit AsResource(AnyPool& pool) : pool_(pool) {}
    std::string name() const override { return pool_.name(); }

   private:
    void* do_allocate(std::size_t bytes, Stream stream) override {
      return pool_.allocate(bytes, kPoolRounding, stream);
    }
    void do_deallocate(void* ptr, std::size_t bytes, Stream stream) override {
      pool_.deallocate(ptr, bytes, stream);
    }
    AnyPool& pool_;
  };

  std::shared_ptr<HeldBytes> held_;
  std::unique_ptr<PoolStack> stack_;
  AsResource pool_resource_{*stack_->pool};
};

InProcessAllocator mode_allocator(PoolMode mode, std::string description) {
  return {to_string(mode), std::move(description),
          [mode](const TargetSettings& s) { return std::make_unique<PoolTarget>(mode, s); }};
}

}  // namespace

const std::vector<InProcessAllocator>& in_process_allocators() {
  static const std::vector<InProcessAllocator> allocators = {
      mode_allocator(PoolMode::kVmm,
                     "sdalloc VirtualMemoryPool (the default where memory is virtual): pages "
                     "mapped on demand, free pages moved under requests"),
      mode_allocator(PoolMode::kPool,
                     "sdalloc CachingPool: the segment cache, for memory in whole segments"),
      mode_allocator(PoolMode::kPlanned,
                     "sdalloc PlannedArena: pass 1 recorded, later passes served from a plan"),
      {"torch-native", "PyTorch's CUDA caching allocator (a model) over host memory",
       make_torch_native_target},
      {"torch-expandable",
       "PyTorch's caching allocator (a model), expandable_segments:True, host pages",
       make_torch_expandable_target},
  };
  return allocators;
}

}  // namespace sdalloc::replay
