// c_pool.hpp - what an sdalloc_pool_t handle of the C API is (internal, C++ only).
//
// A handle owns a whole resource stack - the resources at the bottom (host, a capacity
// limit, or the CUDA resources the PyTorch shim builds), an optional StreamEvents hook for
// device streams, and the CachingPool on top - plus the recorder behind
// sdalloc_pool_trace_start. sdalloc_pool_create builds host stacks; the PyTorch shim
// (src/torch_shim/) builds device stacks with the same type, so every C API function
// (statistics, layout, trace, trim) works on the shim's per-device pools too.
//
// Destruction releases top-down: the pool first (it returns its segments to the resource
// under it), then the resources from the top of the stack to the bottom, then the events.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "allocation_recorder.hpp"
#include "sdalloc/caching_pool.hpp"
#include "sdalloc/resource.hpp"
#include "sdalloc/stream_events.hpp"

struct sdalloc_pool {
  // `stack` lists resources bottom first; the pool is built on stack.back(). Each resource
  // may use the ones before it. `events` may be null (host streams).
  sdalloc_pool(std::vector<std::unique_ptr<sdalloc::MemoryResource>> stack,
               std::unique_ptr<sdalloc::StreamEvents> stream_events,
               sdalloc::CachingPoolOptions options)
      : resources(std::move(stack)), events(std::move(stream_events)) {
    options.stream_events = events.get();
    pool = std::make_unique<sdalloc::CachingPool>(*resources.back(), options);
  }
  sdalloc_pool(const sdalloc_pool&) = delete;
  sdalloc_pool& operator=(const sdalloc_pool&) = delete;
  ~sdalloc_pool() {
    pool.reset();
    while (!resources.empty()) resources.pop_back();
  }

  std::vector<std::unique_ptr<sdalloc::MemoryResource>> resources;
  std::unique_ptr<sdalloc::StreamEvents> events;
  std::unique_ptr<sdalloc::CachingPool> pool;
  sdalloc::detail::AllocationRecorder recorder;
};
