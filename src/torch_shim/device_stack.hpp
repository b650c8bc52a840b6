// device_stack.hpp - the resource stack under one device's pool in the PyTorch shim.
//
// make_device_pool() builds, for one device index and the shim's configuration:
//     mode:pool, async   CachingPool <- LimitResource (capacity, memory_fraction)
//                                    <- HostResource | CudaResource | CudaAsyncResource
//                                       (segments:chunked: VirtualMemoryResource over
//                                       HostVirtualMemory | CudaVirtualMemory)
//     mode:vmm           VirtualMemoryPool (physical cap = capacity, memory_fraction)
//                                    <- HostVirtualMemory | CudaVirtualMemory
//     mode:planned       PlannedArena (fallback: CachingPool with the pool options)
//                                    <- LimitResource <- HostResource | CudaResource
// with CudaStreamEvents for cross-stream frees on CUDA. The result is a C API pool handle
// (c_pool.hpp), so every sdalloc_* function works on it. limit_of() finds the limit, whose
// cap set_memory_fraction changes (none in a virtual-memory pool, whose cap is fixed). The
// limit forwards coalesce and grow, so the pool moves pages and grows its arena in place
// over host memory as it does in `sdalloc replay` (a cap that did not forward them held the
// shim's host pools to separate segments: 1.55 x live on a rising resolution instead of 1.05).
//
// Errors: InvalidArgument for backend:cuda in a build without CUDA, a mode the build lacks,
// a device out of range; CudaError (an sdalloc::Error) when CUDA is not usable here.
#pragma once

#include <cstdint>
#include <memory>

#include "c_api/c_pool.hpp"
#include "sdalloc/resources/limit_resource.hpp"
#include "shim_config.hpp"

namespace sdalloc::torch_shim {

bool built_with_cuda();

// Whether `stream` is capturing a CUDA graph (or the runtime cannot tell), for a CUDA build;
// false in a build without CUDA. Only asked for backend:cuda pools.
bool cuda_stream_capturing(void* stream) noexcept;

std::unique_ptr<sdalloc_pool> make_device_pool(const ShimConfig& config, int device);

// The cap applied to a device's pool: min(capacity, memory_fraction x total), 0 for none.
// `total` is the source's capacity (the device's memory); host: config.capacity.
std::size_t cap_for(const ShimConfig& config, double fraction, std::size_t total);

LimitResource* limit_of(sdalloc_pool& pool);
// The LimitResource capacity for a cap (0, no cap: LimitResource::kNoLimit).
std::size_t limit_for(std::size_t cap);

// Pages a mode:vmm pool has unmapped since its creation (0 for other pools).
std::uint64_t vmm_unmaps(const sdalloc_pool& pool);

// What a memory fraction is a fraction of: the device's memory (the source's capacity), or
// for backend:host the configured capacity.
std::size_t fraction_base(const ShimConfig& config, const sdalloc_pool& pool);

}  // namespace sdalloc::torch_shim
