// device_resource.cpp - CUDA resources by name, and the bundled DevicePool.
#include "sdalloc/cuda/device_resource.hpp"

#include <utility>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/cuda/cuda_async_resource.hpp"
#include "sdalloc/cuda/cuda_resource.hpp"
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

DevicePool::DevicePool(int device, DevicePoolOptions options)
    : device_(device),
      upstream_(make_device_resource(options.upstream, device)),
      events_(std::make_unique<CudaStreamEvents>(device)) {
  options.pool.stream_events = events_.get();
  pool_ = std::make_unique<CachingPool>(*upstream_, options.pool);
}

DevicePool::~DevicePool() = default;

}  // namespace sdalloc::cuda
