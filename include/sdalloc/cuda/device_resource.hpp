// sdalloc/cuda/device_resource.hpp - pick a CUDA resource by name, and a ready device pool.
//
// For front ends that choose the memory source from configuration (the PyTorch shim, the
// CLI, environment variables): one name per resource, a factory, and DevicePool, which
// bundles a resource, its CudaStreamEvents and a CachingPool on top in the right order
// (the pool is destroyed first, then the events, then the resource).
//
//   kind          name           resource
//   kCuda         "cuda"         CudaResource(device)        cudaMalloc / cudaFree
//   kCudaAsync    "cuda_async"   CudaAsyncResource(device)   cudaMallocAsync on its own pool
//   kPinnedHost   "pinned_host"  PinnedHostResource()        cudaHostAlloc (device ignored)
//
// CudaVirtualMemory is not a MemoryResource (it maps chunks into reserved ranges); a
// VirtualMemoryPool is built on it: make_device_virtual_memory() gives one for a device.
//
// Errors: as each resource's constructor (CudaError without a usable driver or device,
// InvalidArgument for a device out of range); parse_device_resource_kind throws
// InvalidArgument naming the accepted names. Thread-safety: the factories are; a DevicePool
// is as thread-safe as CachingPool.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "sdalloc/core/resource.hpp"
#include "sdalloc/core/virtual_memory.hpp"
#include "sdalloc/cuda/cuda_stream_events.hpp"
#include "sdalloc/cuda/cuda_virtual_memory.hpp"
#include "sdalloc/policies/caching_pool.hpp"

namespace sdalloc::cuda {

enum class DeviceResourceKind { kCuda, kCudaAsync, kPinnedHost };

std::string_view to_string(DeviceResourceKind kind);  // "cuda", "cuda_async", "pinned_host"
DeviceResourceKind parse_device_resource_kind(std::string_view name);

// A new resource of `kind` for `device` (ignored for kPinnedHost), with default options.
std::unique_ptr<MemoryResource> make_device_resource(DeviceResourceKind kind, int device = 0);

// A CudaVirtualMemory for `device`, as the VirtualMemory interface.
std::unique_ptr<VirtualMemory> make_device_virtual_memory(int device = 0,
                                                          CudaVirtualMemoryOptions options = {});

struct DevicePoolOptions {
  DeviceResourceKind upstream = DeviceResourceKind::kCuda;
  // The pool's options; stream_events is set by DevicePool (to its CudaStreamEvents).
  CachingPoolOptions pool;
};

// upstream resource + CudaStreamEvents + CachingPool for one device, owned together.
class DevicePool {
 public:
  explicit DevicePool(int device = 0, DevicePoolOptions options = {});
  ~DevicePool();
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;

  int device() const { return device_; }
  CachingPool& pool() { return *pool_; }
  MemoryResource& upstream() { return *upstream_; }
  CudaStreamEvents& events() { return *events_; }

 private:
  int device_;
  std::unique_ptr<MemoryResource> upstream_;
  std::unique_ptr<CudaStreamEvents> events_;
  std::unique_ptr<CachingPool> pool_;  // declared last: destroyed first
};

}  // namespace sdalloc::cuda
