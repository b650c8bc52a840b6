// device_stack.hpp - one device's pool in the PyTorch shim: its memory, built by make_pool().
//
// make_device_pool() describes the device's memory as a MemoryBackend and hands it, with the
// shim's configuration, to make_pool() (sdalloc/config/make_pool.hpp), the one place pools
// are built:
//     backend:cuda   cuda::device_backend(): CUDA virtual memory (the default pool, mode
//                    auto, is a VirtualMemoryPool over it), cudaMalloc segments (mode:pool,
//                    planned), a cudaMallocAsync pool for mode:async, CudaStreamEvents
//     backend:host   host_backend(): anonymous pages in reserved ranges and mmap'd segments
// The virtual memory is wrapped in a CountingVirtualMemory, so the shim can say how often a
// vmm pool unmapped or moved pages. The result is a C API pool handle (c_pool.hpp), so every
// sdalloc_* function works on it; set_memory_fraction changes its cap
// (PoolStack::set_capacity) in every mode.
//
// Errors: InvalidArgument for backend:cuda in a build without CUDA, a device out of range,
// mode:vmm where the device has no virtual memory (the message says why the driver refused);
// CudaError (an sdalloc::Error) when CUDA is not usable here.
#pragma once

#include <cstdint>
#include <memory>

#include "c_api/c_pool.hpp"
#include "shim_config.hpp"

namespace sdalloc::torch_shim {

bool built_with_cuda();

// Whether `stream` is capturing a CUDA graph (or the runtime cannot tell), for a CUDA build;
// false in a build without CUDA. Only asked for backend:cuda pools.
bool cuda_stream_capturing(void* stream) noexcept;

std::unique_ptr<sdalloc_pool> make_device_pool(const ShimConfig& config, int device);

// The cap applied to a device's pool: min(capacity, memory_fraction x total), 0 for none.
// `total` is the device's memory; host: config.capacity.
std::size_t cap_for(const ShimConfig& config, double fraction, std::size_t total);

// Pages a mode:vmm pool has unmapped or moved since its creation (0 for other pools).
std::uint64_t vmm_unmaps(const sdalloc_pool& pool);

// What a memory fraction is a fraction of: the device's memory, or for backend:host the
// configured capacity.
std::size_t fraction_base(const ShimConfig& config, const sdalloc_pool& pool);

}  // namespace sdalloc::torch_shim
