// device_resource.cpp - CUDA resources by name, and a device as a pool's backend.
#include "sdalloc/cuda/device_resource.hpp"

#include <utility>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/cuda/cuda_async_resource.hpp"
#include "sdalloc/cuda/cuda_resource.hpp"
#include "sdalloc/cuda/cuda_stream_events.hpp"
#include "sdalloc/cuda/pinned_host_resource.hpp"

namespace sdalloc::cuda {

std::string_view to_string(DeviceResourceKind kind) {
  switch (kind) {
    case DeviceResourceKind::kCuda:
      return "cuda";
    case DeviceResourceKind::kCudaAsync:
      return "cuda_async";
    case DeviceResourceKind::kPinnedHost:
      return "pinned_host";
  }
  return "unknown";
}

DeviceResourceKind parse_device_resource_kind(std::string_view name) {
  for (DeviceResourceKind kind : {DeviceResourceKind::kCuda, DeviceResourceKind::kCudaAsync,
                                  DeviceResourceKind::kPinnedHost}) {
    if (name == to_string(kind)) return kind;
  }
  throw InvalidArgument("unknown CUDA resource '" + std::string(name) +
                        "': expected one of cuda, cuda_async, pinned_host");
}

std::unique_ptr<MemoryResource> make_device_resource(DeviceResourceKind kind, int device) {
  switch (kind) {
    case DeviceResourceKind::kCuda:
      return std::make_unique<CudaResource>(device);
    case DeviceResourceKind::kCudaAsync:
      return std::make_unique<CudaAsyncResource>(device);
    case DeviceResourceKind::kPinnedHost:
      return std::make_unique<PinnedHostResource>();
  }
  throw InvalidArgument("make_device_resource: unknown resource kind " +
                        std::to_string(static_cast<int>(kind)));
}

std::unique_ptr<VirtualMemory> make_device_virtual_memory(int device,
                                                          CudaVirtualMemoryOptions options) {
  return std::make_unique<CudaVirtualMemory>(device, std::move(options));
}

MemoryBackend device_backend(int device, DeviceBackendOptions options, std::string* refused) {
  MemoryBackend backend;
  backend.name = "cuda:" + std::to_string(device);
  backend.segments = std::make_unique<CudaResource>(device);
  backend.events = std::make_unique<CudaStreamEvents>(device);
  if (options.async_segments) backend.async_segments = std::make_unique<CudaAsyncResource>(device);
  if (options.virtual_memory) {
    CudaVirtualMemoryOptions vm_options;
    vm_options.unmap_wait = UnmapWait::kStream;
    try {
      backend.virtual_memory = std::make_unique<CudaVirtualMemory>(device, vm_options);
    } catch (const Error& e) {
      if (refused != nullptr) *refused = e.what();
    }
  }
  return backend;
}

}  // namespace sdalloc::cuda
