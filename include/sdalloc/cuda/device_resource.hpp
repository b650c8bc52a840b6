// sdalloc/cuda/device_resource.hpp - pick a CUDA resource by name, and a device as a backend.
//
// For front ends that choose the memory source from configuration (the PyTorch shim, the
// CLI, environment variables): one name per resource, a factory, and device_backend(), a
// device's memory described for make_pool() (sdalloc/config/make_pool.hpp): its virtual
// memory (so the default pool there is a VirtualMemoryPool), cudaMalloc segments, a
// cudaMallocAsync pool when asked for, and the device's CudaStreamEvents.
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
// InvalidArgument naming the accepted names. Thread-safety: the factories are.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "sdalloc/core/memory_backend.hpp"
#include "sdalloc/core/resource.hpp"
#include "sdalloc/core/virtual_memory.hpp"
#include "sdalloc/cuda/cuda_stream_events.hpp"
#include "sdalloc/cuda/cuda_virtual_memory.hpp"

namespace sdalloc::cuda {

enum class DeviceResourceKind { kCuda, kCudaAsync, kPinnedHost };

std::string_view to_string(DeviceResourceKind kind);  // "cuda", "cuda_async", "pinned_host"
DeviceResourceKind parse_device_resource_kind(std::string_view name);

// A new resource of `kind` for `device` (ignored for kPinnedHost), with default options.
std::unique_ptr<MemoryResource> make_device_resource(DeviceResourceKind kind, int device = 0);

// A CudaVirtualMemory for `device`, as the VirtualMemory interface.
std::unique_ptr<VirtualMemory> make_device_virtual_memory(int device = 0,
                                                          CudaVirtualMemoryOptions options = {});

struct DeviceBackendOptions {
  // Offer the device's virtual memory (cuMem). Where the driver refuses it (a device without
  // virtual memory management), the backend has whole segments only and says why in
  // `virtual_memory_refused`.
  bool virtual_memory = true;
  // Also make a private cudaMallocAsync pool (mode:async's segments).
  bool async_segments = false;
};

// One device's memory for make_pool(): virtual memory (unmap waits for the page's own
// stream only, which is all the pool's cross-stream rules leave to wait for), cudaMalloc
// segments, optionally cudaMallocAsync segments, and CudaStreamEvents. `refused` (if given)
// receives why the virtual memory was left out, or stays empty.
MemoryBackend device_backend(int device, DeviceBackendOptions options = {},
                             std::string* refused = nullptr);

}  // namespace sdalloc::cuda
