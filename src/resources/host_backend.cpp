// host_backend.cpp - host memory as a pool's backend (sdalloc/resources/host_backend.hpp).
#include "sdalloc/resources/host_backend.hpp"

#include <memory>

#include "sdalloc/resources/host_resource.hpp"
#include "sdalloc/resources/host_virtual_memory.hpp"

namespace sdalloc {

MemoryBackend host_backend(HostBackendOptions options) {
  MemoryBackend backend;
  backend.name = options.transparent_huge_pages ? "host(thp)" : "host";
  backend.segments = std::make_unique<HostResource>(
      HostResourceOptions{.transparent_huge_pages = options.transparent_huge_pages});
  if (options.virtual_memory && !options.transparent_huge_pages) {
    backend.virtual_memory = std::make_unique<HostVirtualMemory>();
  }
  backend.host_pages = true;
  return backend;
}

}  // namespace sdalloc
