// tools/sdalloc/replay/measured_backend.hpp - host memory as a pool's backend, every byte the
// system hands out counted in one place.
//
// `sdalloc replay` reports what an allocator held from the system at its peak. sdalloc's
// pools are built by make_pool() over a MemoryBackend; this one's segments (mmap) and
// physical chunks (HostVirtualMemory) both pass through counting adaptors that add to one
// HeldBytes, so the peak is the most held at once whichever way the pool took its memory (a
// planned arena's segments beside a fallback's, say). Measured, never estimated: the adaptors count
// what the system said yes to. The counters outlive the backend (shared).
//
// As on a GPU (device_like): the virtual memory maps 2 MiB pages and cannot move them
// (unmap and map instead), as CUDA's cuMem API; segments are unchanged (cudaMalloc's are
// whole segments too).
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>

#include "sdalloc/core/memory_backend.hpp"

namespace sdalloc::replay {

struct HeldBytes {
  std::atomic<std::size_t> current{0};
  std::atomic<std::size_t> peak{0};
  void add(std::size_t bytes);
  void sub(std::size_t bytes) { current.fetch_sub(bytes, std::memory_order_relaxed); }
};

struct MeasuredBackendOptions {
  bool huge_pages = false;           // segments with transparent huge pages
  bool device_like = false;          // virtual memory as a GPU's (see above)
  bool virtual_memory_moves = true;  // false: unmap and map pages instead of moving them
};

MemoryBackend measured_host_backend(const MeasuredBackendOptions& options,
                                    std::shared_ptr<HeldBytes> held);

}  // namespace sdalloc::replay
