// sdalloc/config/make_pool.hpp - the one place pools are built: configuration + memory -> pool.
//
// Every front end builds its pools here: the C API (sdalloc_pool_create), the PyTorch shim,
// the CPU drop-in, the ONNX Runtime adapter, `sdalloc replay` and `sdalloc run`. A front end
// describes its memory once (a MemoryBackend: core/memory_backend.hpp) and its settings as a
// PoolConf (read from SDALLOC_CONF, the C config struct or Python keywords, all through one
// option table: src/config/pool_conf.hpp), and make_pool() answers the pool with everything
// under it, owned together (PoolStack).
//
// Which pool (`mode`; docs/pools.md says why):
//   auto     the default: vmm where the backend offers virtual memory, else pool. Pages, not
//            segments, wherever memory is virtual.
//   vmm      VirtualMemoryPool over backend.virtual_memory (InvalidArgument without one);
//            capacity caps its physical chunks.
//   pool     CachingPool over backend.segments: the segment cache, for memory that cannot
//            be remapped; capacity caps its segments (a LimitResource).
//   async    CachingPool over backend.async_segments, a device's stream-ordered allocator
//            (cudaMallocAsync); InvalidArgument where the backend has none.
//   planned  PlannedArena: a repeated step served from one planned arena. Where the backend
//            offers virtual memory, the arena and every other request come from one
//            VirtualMemoryPool over it (its pages move between the recording and the
//            arena; capacity caps its chunks); elsewhere the arena is taken from
//            backend.segments and other requests from a CachingPool over the same capped
//            segments.
// The cap of pool (and of planned over segments) is a LimitResource over the segments
// (PoolStack::limit), that of vmm (and of planned over pages) the VirtualMemoryPool's own
// physical cap; PoolStack::set_capacity changes it later (the shim's memory fraction).
//
// Errors: InvalidArgument for a mode the backend cannot serve or a row any pool would reject,
// whichever mode is built (the message names the options and the field); OutOfMemory when an
// initial reservation cannot be taken. Nothing is left behind on failure.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "sdalloc/core/memory_backend.hpp"
#include "sdalloc/policies/any_pool.hpp"
#include "sdalloc/policies/caching_pool.hpp"
#include "sdalloc/policies/virtual_memory_pool.hpp"
#include "sdalloc/resources/limit_resource.hpp"

namespace sdalloc {

enum class PoolMode { kAuto, kPool, kAsync, kVmm, kPlanned };

// "auto", "pool", "async", "vmm", "planned".
std::string to_string(PoolMode mode);

// What every front end may set; each field is one row of the option table
// (src/config/pool_conf.hpp), where its SDALLOC_CONF key, help and C field are written.
struct PoolConf {
  PoolMode mode = PoolMode::kAuto;
  std::size_t capacity = 0;      // bytes one pool may hold; 0: no cap
  CachingPoolOptions pool;       // mode:pool, and planned's segments
  std::size_t replan_after = 3;  // mode:planned: divergent steps in a row before re-recording
  std::size_t max_plans = 4;     // mode:planned: plans kept at once (kinds of step)
  std::size_t plan_nodes = 0;    // mode:planned: search nodes per plan; 0: only the time limit
};

// A pool and everything under it, destroyed top-down: the pool, then the cap, then the
// backend (its events last).
struct PoolStack {
  PoolStack() = default;
  PoolStack(const PoolStack&) = delete;
  PoolStack& operator=(const PoolStack&) = delete;
  ~PoolStack();

  // Changes the cap (0: none), whichever mode was built; what is held stays held.
  void set_capacity(std::size_t bytes);

  MemoryBackend backend;
  std::unique_ptr<LimitResource> limit;  // over backend.segments; null for a vmm pool
  std::unique_ptr<AnyPool> pool;
  PoolMode mode = PoolMode::kAuto;  // the mode built: never kAuto
};

// The mode `requested` resolves to on `backend`.
PoolMode resolve_mode(PoolMode requested, const MemoryBackend& backend);

std::unique_ptr<PoolStack> make_pool(const PoolConf& conf, MemoryBackend backend);

// The pool of a stack, sharing ownership of the whole stack (for owners that hold pools by
// std::shared_ptr<AnyPool>, such as the ONNX Runtime adapter).
std::shared_ptr<AnyPool> share_pool(std::unique_ptr<PoolStack> stack);

}  // namespace sdalloc
