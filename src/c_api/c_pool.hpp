// c_pool.hpp - what an sdalloc_pool_t handle of the C API is (internal, C++ only).
//
// A handle owns a whole stack - the resources or the virtual memory at the bottom (host
// memory, a capacity limit, or the CUDA sources the PyTorch shim builds), an optional
// StreamEvents hook for device streams, and the pool on top - plus the recorder behind
// sdalloc_pool_trace_start. The pool is a CachingPool over the resource stack, a
// PlannedArena over it (config.planned, the shim's mode:planned), or a VirtualMemoryPool
// over a VirtualMemory (the shim's mode:vmm); HandlePool is the part of their interfaces the
// C API calls, so every sdalloc_* function works on any of them. A VirtualMemoryPool has no
// segment layout, and only a planned pool has steps: those calls fail with InvalidArgument
// saying so.
//
// sdalloc_pool_create builds host stacks; the shim (src/torch_shim/) builds device stacks.
// Destruction releases top-down: the pool first (it returns its memory to what is under
// it), then the resources from the top of the stack to the bottom, the virtual memory, and
// the events last.
#pragma once

#include <cstddef>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "trace/allocation_recorder.hpp"
#include "sdalloc/policies/caching_pool.hpp"
#include "sdalloc/core/errors.hpp"
#include "sdalloc/policies/planned_arena.hpp"
#include "sdalloc/core/pool_layout.hpp"
#include "sdalloc/core/pool_stats.hpp"
#include "sdalloc/core/resource.hpp"
#include "sdalloc/core/stream_events.hpp"
#include "sdalloc/core/virtual_memory.hpp"
#include "sdalloc/policies/virtual_memory_pool.hpp"

namespace sdalloc::detail {

class HandlePool {
 public:
  virtual ~HandlePool() = default;
  virtual void* allocate(std::size_t bytes, std::size_t alignment, Stream stream) = 0;
  virtual void free(void* ptr, Stream stream) = 0;
  virtual void record_stream(void* ptr, Stream stream) = 0;
  virtual std::size_t allocation_size(const void* ptr) const = 0;
  virtual std::size_t trim() = 0;
  virtual PoolStats stats() const = 0;
  virtual void reset_peak() = 0;
  virtual PoolLayout layout() const = 0;
  // Steps: only a planned pool has them.
  virtual PlannedArena& planned() {
    throw InvalidArgument(
        "the pool is not a planned pool: steps need sdalloc_pool_config_t.planned (C API) or "
        "mode:planned (PyTorch shim)");
  }
};

// The one HandlePool: it forwards to a CachingPool, a PlannedArena or a VirtualMemoryPool,
// and answers InvalidArgument for what the pool type cannot do.
template <typename Pool>
class HandlePoolOf final : public HandlePool {
 public:
  template <typename... Args>
  explicit HandlePoolOf(Args&&... args) : pool_(std::forward<Args>(args)...) {}

  void* allocate(std::size_t bytes, std::size_t alignment, Stream stream) override {
    return pool_.allocate(bytes, alignment, stream);
  }
  void free(void* ptr, Stream stream) override { pool_.free(ptr, stream); }
  void record_stream(void* ptr, Stream stream) override { pool_.record_stream(ptr, stream); }
  std::size_t allocation_size(const void* ptr) const override { return pool_.allocation_size(ptr); }
  std::size_t trim() override { return pool_.trim(); }
  PoolStats stats() const override { return pool_.stats(); }
  void reset_peak() override { pool_.reset_peak(); }
  PoolLayout layout() const override {
    if constexpr (requires { pool_.layout(); }) {
      return pool_.layout();
    } else {
      throw InvalidArgument(
          "a virtual-memory pool (mode:vmm) has no segment layout: its memory is pages mapped "
          "into reserved ranges (use the statistics instead)");
    }
  }
  PlannedArena& planned() override {
    if constexpr (std::is_same_v<Pool, PlannedArena>) {
      return pool_;
    } else {
      return HandlePool::planned();  // throws
    }
  }

 private:
  Pool pool_;
};

}  // namespace sdalloc::detail

struct sdalloc_pool {
  // A CachingPool on stack.back(). `stack` lists resources bottom first; each may use the
  // ones before it. `events` may be null (host streams).
  sdalloc_pool(std::vector<std::unique_ptr<sdalloc::MemoryResource>> stack,
               std::unique_ptr<sdalloc::StreamEvents> stream_events,
               sdalloc::CachingPoolOptions options)
      : resources(std::move(stack)), events(std::move(stream_events)) {
    options.stream_events = events.get();
    pool = std::make_unique<sdalloc::detail::HandlePoolOf<sdalloc::CachingPool>>(*resources.back(),
                                                                                 options);
  }
  // A PlannedArena on stack.back(); its fallback pool uses `stream_events`.
  sdalloc_pool(std::vector<std::unique_ptr<sdalloc::MemoryResource>> stack,
               std::unique_ptr<sdalloc::StreamEvents> stream_events,
               sdalloc::PlannedArenaOptions options)
      : resources(std::move(stack)), events(std::move(stream_events)) {
    options.fallback.stream_events = events.get();
    pool = std::make_unique<sdalloc::detail::HandlePoolOf<sdalloc::PlannedArena>>(*resources.back(),
                                                                                  options);
  }
  // A VirtualMemoryPool over `memory`.
  sdalloc_pool(std::unique_ptr<sdalloc::VirtualMemory> memory,
               std::unique_ptr<sdalloc::StreamEvents> stream_events,
               sdalloc::VirtualMemoryPoolOptions options)
      : virtual_memory(std::move(memory)), events(std::move(stream_events)) {
    options.stream_events = events.get();
    pool = std::make_unique<sdalloc::detail::HandlePoolOf<sdalloc::VirtualMemoryPool>>(
        *virtual_memory, options);
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
  std::unique_ptr<sdalloc::detail::HandlePool> pool;
  sdalloc::detail::AllocationRecorder recorder;
};
