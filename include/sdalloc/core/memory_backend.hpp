// sdalloc/core/memory_backend.hpp - what a machine offers a pool: the memory under it.
//
// A front end describes the memory it has once, as a MemoryBackend, and hands it to the one
// function that builds pools (make_pool, sdalloc/config/make_pool.hpp), which picks the pool
// from it and the configuration:
//   - virtual_memory: memory that can be mapped page by page into reserved address ranges
//     (CUDA's cuMem API, the host's HostVirtualMemory, the CPU drop-in's reserved range). Where it
//     is present the default pool is a VirtualMemoryPool over it: pages, not segments.
//   - segments: whole segments (cudaMalloc, cudaMallocAsync, pinned or plain host memory,
//     memory a caller hands in). The segment cache (CachingPool) and the planned arena take
//     their memory from here. Always present.
//   - async_segments: a device's stream-ordered allocator (cudaMallocAsync), where there is
//     one: mode:async's segments.
//   - events: how pools learn that a stream's work is done (nullptr: host streams, where
//     everything is done at once).
//   - host_pages: the segments are host memory, so a planned arena may fault its pages in
//     when it is reserved rather than during the first planned step.
//   - vm_page_size, vm_range_size: what the virtual memory asks of a pool's pages and
//     reserved ranges (0: the pool's defaults). The drop-in's memory is one finite range
//     whose anonymous pages are cheapest mapped 2 MiB at a time.
// Makers: host_backend() (resources/host_backend.hpp), cuda::device_backend()
// (cuda/device_backend.hpp), the drop-in's own (src/preload/). The pool built on a backend
// owns it (PoolStack): the backend lives as long as the pool that uses it.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "sdalloc/core/resource.hpp"
#include "sdalloc/core/stream_events.hpp"
#include "sdalloc/core/virtual_memory.hpp"

namespace sdalloc {

struct MemoryBackend {
  std::string name;  // for messages: "host", "cuda:0", "preload range"
  std::unique_ptr<VirtualMemory> virtual_memory;
  std::unique_ptr<MemoryResource> segments;
  std::unique_ptr<MemoryResource> async_segments;
  std::unique_ptr<StreamEvents> events;
  bool host_pages = false;
  std::size_t vm_page_size = 0;
  std::size_t vm_range_size = 0;
};

}  // namespace sdalloc
