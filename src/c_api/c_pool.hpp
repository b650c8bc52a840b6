// c_pool.hpp - what an sdalloc_pool_t handle of the C API is (internal, C++ only).
//
// A handle owns a whole stack - the resources or the virtual memory at the bottom (host
// memory, a capacity limit, or the CUDA sources the PyTorch shim builds), an optional
// StreamEvents hook for device streams, and the pool on top - plus the recorder behind
// sdalloc_pool_trace_start. The pool is a CachingPool over the resource stack, a
// PlannedArena over it (config.planned, the shim's mode:planned), or a VirtualMemoryPool
// over a VirtualMemory (the shim's mode:vmm), held as an AnyPool
// (sdalloc/policies/any_pool.hpp), so every sdalloc_* function works on any of them. A
// VirtualMemoryPool has no segment layout, and only a planned pool has steps: those calls
// fail with InvalidArgument saying so.
//
// sdalloc_pool_create builds host stacks; the shim (src/torch_shim/) builds device stacks.
// Destruction releases top-down: the pool first (it returns its memory to what is under
// it), then the resources from the top of the stack to the bottom, the virtual memory, and
// the events last.
#pragma once

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/core/resource.hpp"
#include "sdalloc/core/stream_events.hpp"
#include "sdalloc/core/virtual_memory.hpp"
#include "sdalloc/policies/any_pool.hpp"
#include "trace/allocation_recorder.hpp"

namespace sdalloc::detail {

// The PlannedArena behind a handle; InvalidArgument for a pool without steps.
inline PlannedArena& planned_of(AnyPool& pool) {
  PlannedArena* arena = pool.planned();
  if (arena == nullptr) {
    throw InvalidArgument(
        "the pool is not a planned pool: steps need sdalloc_pool_config_t.planned (C API) or "
        "mode:planned (PyTorch shim)");
  }
  return *arena;
}

}  // namespace sdalloc::detail

struct sdalloc_pool {
  // A CachingPool on stack.back(). `stack` lists resources bottom first; each may use the
  // ones before it. `events` may be null (host streams).
  sdalloc_pool(std::vector<std::unique_ptr<sdalloc::MemoryResource>> stack,
               std::unique_ptr<sdalloc::StreamEvents> stream_events,
               sdalloc::CachingPoolOptions options)
      : resources(std::move(stack)), events(std::move(stream_events)) {
    options.stream_events = events.get();
    pool = std::make_unique<sdalloc::PoolOf<sdalloc::CachingPool>>(*resources.back(), options);
  }
  // A PlannedArena on stack.back(); its fallback pool uses `stream_events`.
  sdalloc_pool(std::vector<std::unique_ptr<sdalloc::MemoryResource>> stack,
               std::unique_ptr<sdalloc::StreamEvents> stream_events,
               sdalloc::PlannedArenaOptions options)
      : resources(std::move(stack)), events(std::move(stream_events)) {
    options.fallback.stream_events = events.get();
    pool = std::make_unique<sdalloc::PoolOf<sdalloc::PlannedArena>>(*resources.back(), options);
  }
  // A VirtualMemoryPool over `memory`.
  sdalloc_pool(std::unique_ptr<sdalloc::VirtualMemory> memory,
               std::unique_ptr<sdalloc::StreamEvents> stream_events,
               sdalloc::VirtualMemoryPoolOptions options)
      : virtual_memory(std::move(memory)), events(std::move(stream_events)) {
    options.stream_events = events.get();
    pool = std::make_unique<sdalloc::PoolOf<sdalloc::VirtualMemoryPool>>(*virtual_memory, options);
  }
  sdalloc_pool(const sdalloc_pool&) = delete;
  sdalloc_pool& operator=(const sdalloc_pool&) = delete;
  ~sdalloc_pool() {
    pool.reset();
    while (!resources.empty()) resources.pop_back();
    virtual_memory.reset();
  }

  std::vector<std::unique_ptr<sdalloc::MemoryResource>> resources;  // empty for a vm pool
  std::unique_ptr<sdalloc::VirtualMemory> virtual_memory;           // null for a caching pool
  std::unique_ptr<sdalloc::StreamEvents> events;
  std::unique_ptr<sdalloc::AnyPool> pool;
  sdalloc::detail::AllocationRecorder recorder;
};
