// make_pool.cpp - the one place pools are built (sdalloc/config/make_pool.hpp).
#include "sdalloc/config/make_pool.hpp"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/policies/planned_arena.hpp"

namespace sdalloc {
namespace {

// The planned arena's fallback, and every mode:pool pool: a CachingPool over `segments`.
std::unique_ptr<AnyPool> make_caching_pool(MemoryResource& segments, CachingPoolOptions options,
                                           StreamEvents* events) {
  options.stream_events = events;
  return std::make_unique<PoolOf<CachingPool>>(segments, options);
}

VirtualMemoryPoolOptions vm_options_of(const PoolConf& conf, const MemoryBackend& backend) {
  VirtualMemoryPoolOptions options;
  options.max_physical_bytes = conf.capacity;
  options.stream_events = backend.events.get();
  if (backend.vm_page_size != 0) options.page_size = backend.vm_page_size;
  if (backend.vm_range_size != 0) options.range_size = backend.vm_range_size;
  return options;
}

std::unique_ptr<AnyPool> make_vm_pool(const PoolConf& conf, const MemoryBackend& backend) {
  return std::make_unique<PoolOf<VirtualMemoryPool>>(*backend.virtual_memory,
                                                     vm_options_of(conf, backend));
}

PlannedArenaOptions planned_options_of(const PoolConf& conf, const MemoryBackend& backend) {
  PlannedArenaOptions options;
  options.replan_after_divergent_steps = conf.replan_after;
  options.max_plans = conf.max_plans;
  options.planner_max_search_nodes = conf.plan_nodes;
  options.fallback = conf.pool;
  options.fallback.stream_events = backend.events.get();
  options.prefault_host_arena = backend.host_pages;
  options.arena_from_fallback = backend.virtual_memory != nullptr;
  return options;
}

// Where memory is virtual, the planned arena's fallback is a VirtualMemoryPool and the
// arenas are its allocations: the recording's pages move under the arena and back
// (PlannedArenaOptions::arena_from_fallback). growth_slack 0: a recording creates a page
// only when no free one is left. Pages of kPlannedPageSize unless the backend asks for
// others: what a recording holds beyond its live bytes is the pages its free gaps share
// with live blocks, so small pages keep it at its live peak (docs/planned_arena.md).
constexpr std::size_t kPlannedPageSize = std::size_t{16} << 10;

std::unique_ptr<AnyPool> make_planned_arena(const PoolConf& conf, MemoryResource& segments,
                                            const MemoryBackend& backend) {
  const PlannedArenaOptions options = planned_options_of(conf, backend);
  StreamEvents* events = backend.events.get();
  if (options.arena_from_fallback) {
    VirtualMemory& memory = *backend.virtual_memory;
    VirtualMemoryPoolOptions vm = vm_options_of(conf, backend);
    vm.growth_slack = 0.0;
    if (backend.vm_page_size == 0) vm.page_size = std::max(kPlannedPageSize, memory.granularity());
    return std::make_unique<PoolOf<PlannedArena>>(
        segments, options, [&memory, vm](MemoryResource&, const CachingPoolOptions&) {
          return std::make_unique<PoolOf<VirtualMemoryPool>>(memory, vm);
        });
  }
  return std::make_unique<PoolOf<PlannedArena>>(
      segments, options, [events](MemoryResource& held, const CachingPoolOptions& fallback) {
        return make_caching_pool(held, fallback, events);
      });
}

}  // namespace

std::string to_string(PoolMode mode) {
  switch (mode) {
    case PoolMode::kAuto:
      return "auto";
    case PoolMode::kPool:
      return "pool";
    case PoolMode::kAsync:
      return "async";
    case PoolMode::kVmm:
      return "vmm";
    case PoolMode::kPlanned:
      return "planned";
  }
  return "unknown";
}

PoolStack::~PoolStack() {
  pool.reset();
  limit.reset();
}

void PoolStack::set_capacity(std::size_t bytes) {
  if (limit != nullptr) limit->set_capacity(bytes == 0 ? LimitResource::kNoLimit : bytes);
  VirtualMemoryPool* vm = pool->vmm();
  if (PlannedArena* planned = pool->planned(); planned != nullptr) {
    vm = planned->fallback_pool().vmm();  // the planned arena's pages, where memory is virtual
  }
  if (vm != nullptr) vm->set_capacity(bytes);
}

PoolMode resolve_mode(PoolMode requested, const MemoryBackend& backend) {
  if (requested != PoolMode::kAuto) return requested;
  return backend.virtual_memory != nullptr ? PoolMode::kVmm : PoolMode::kPool;
}

std::unique_ptr<PoolStack> make_pool(const PoolConf& conf, MemoryBackend backend) {
  // Every row is checked whichever mode reads it: a bad value is a mistake in the caller's
  // configuration even where this machine's mode would not have used it.
  planned_options_of(conf, backend).validate();
  const PoolMode mode = resolve_mode(conf.mode, backend);
  if (mode == PoolMode::kVmm && backend.virtual_memory == nullptr) {
    throw InvalidArgument("mode:vmm needs memory that can be mapped page by page, and " +
                          backend.name + " offers whole segments only (mode:pool serves it)");
  }
  if (mode == PoolMode::kAsync && backend.async_segments == nullptr) {
    throw InvalidArgument("mode:async needs a stream-ordered allocator (cudaMallocAsync), and " +
                          backend.name + " has none");
  }
  if (mode != PoolMode::kVmm && backend.segments == nullptr) {
    throw InvalidArgument("mode:" + to_string(mode) + " needs segments, and " + backend.name +
                          " offers none");
  }
  auto stack = std::make_unique<PoolStack>();
  stack->backend = std::move(backend);
  stack->mode = mode;
  const MemoryBackend& memory = stack->backend;
  if (mode == PoolMode::kVmm) {
    stack->pool = make_vm_pool(conf, memory);
    return stack;
  }
  MemoryResource& segments = mode == PoolMode::kAsync ? *memory.async_segments : *memory.segments;
  stack->limit = std::make_unique<LimitResource>(
      segments, conf.capacity == 0 ? LimitResource::kNoLimit : conf.capacity);
  if (mode == PoolMode::kPlanned) {
    stack->pool = make_planned_arena(conf, *stack->limit, memory);
  } else {
    stack->pool = make_caching_pool(*stack->limit, conf.pool, memory.events.get());
  }
  return stack;
}

std::shared_ptr<AnyPool> share_pool(std::unique_ptr<PoolStack> stack) {
  std::shared_ptr<PoolStack> shared = std::move(stack);
  AnyPool* pool = shared->pool.get();
  return {std::move(shared), pool};
}

}  // namespace sdalloc
