// sdalloc/resources/host_backend.hpp - host memory as a pool's backend (core/memory_backend.hpp).
//
// host_backend() describes what the host offers a pool: anonymous pages mapped into reserved
// address ranges (HostVirtualMemory: the default pool is then a VirtualMemoryPool) and plain
// mmap'd segments (HostResource) for the segment cache and the planned arena. With
// transparent huge pages the memory is segments only: the pool's pages (64 KiB) are smaller
// than a huge page, and a caller who asks for huge pages gets the pool that uses them.
#pragma once

#include "sdalloc/core/memory_backend.hpp"

namespace sdalloc {

struct HostBackendOptions {
  bool transparent_huge_pages = false;  // segments 2 MiB-aligned and madvised; no virtual memory
  bool virtual_memory = true;           // offer HostVirtualMemory (false: segments only)
};

MemoryBackend host_backend(HostBackendOptions options = {});

}  // namespace sdalloc
