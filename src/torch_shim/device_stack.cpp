// device_stack.cpp - building one device's resource stack for the PyTorch shim.
#include "device_stack.hpp"

#include "counting_virtual_memory.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/policies/virtual_memory_pool.hpp"
#include "sdalloc/resources/host_resource.hpp"
#include "sdalloc/resources/host_virtual_memory.hpp"
#include "sdalloc/resources/virtual_memory_resource.hpp"

#if SDALLOC_TORCH_WITH_CUDA
#include "sdalloc/cuda/cuda_async_resource.hpp"
#include "sdalloc/cuda/cuda_resource.hpp"
#include "sdalloc/cuda/cuda_stream_events.hpp"
#include "sdalloc/cuda/cuda_virtual_memory.hpp"
#include "sdalloc/cuda/runtime.hpp"
#endif

namespace sdalloc::torch_shim {

bool built_with_cuda() { return SDALLOC_TORCH_WITH_CUDA != 0; }

bool cuda_stream_capturing(void* stream) noexcept {
#if SDALLOC_TORCH_WITH_CUDA
  return cuda::stream_capture(stream) != cuda::StreamCapture::kNone;
#else
  (void)stream;
  return false;
#endif
}

std::size_t cap_for(const ShimConfig& config, double fraction, std::size_t total) {
  std::size_t cap = config.capacity;
  if (fraction > 0.0 && total > 0) {
    const auto share = static_cast<std::size_t>(std::floor(fraction * static_cast<double>(total)));
    cap = cap == 0 ? share : std::min(cap, share);
  }
  return cap;
}

std::size_t limit_for(std::size_t cap) { return cap == 0 ? LimitResource::kNoLimit : cap; }

std::uint64_t vmm_unmaps(const sdalloc_pool& pool) {
  const auto* counting = dynamic_cast<const CountingVirtualMemory*>(pool.virtual_memory.get());
  return counting == nullptr ? 0 : counting->unmaps();
}

LimitResource* limit_of(sdalloc_pool& pool) {
  if (pool.resources.size() < 2) return nullptr;  // a virtual-memory pool: no limit layer
  return static_cast<LimitResource*>(pool.resources[1].get());
}

std::size_t fraction_base(const ShimConfig& config, const sdalloc_pool& pool) {
  if (config.backend == Backend::kHost) return config.capacity;
  if (pool.virtual_memory != nullptr) return pool.virtual_memory->physical_capacity();
  return pool.resources.front()->capacity();
}

namespace {

using Stack = std::vector<std::unique_ptr<MemoryResource>>;

// mode:vmm: a VirtualMemoryPool whose physical cap is the configured cap (fixed for the
// pool's life: set memory_fraction before the first allocation).
std::unique_ptr<sdalloc_pool> make_vm_pool(const ShimConfig& config,
                                           std::unique_ptr<VirtualMemory> memory,
                                           std::unique_ptr<StreamEvents> events) {
  VirtualMemoryPoolOptions options;
  options.max_physical_bytes =
      cap_for(config, config.memory_fraction,
              config.backend == Backend::kHost ? config.capacity : memory->physical_capacity());
  return std::make_unique<sdalloc_pool>(std::make_unique<CountingVirtualMemory>(std::move(memory)),
                                        std::move(events), options);
}

std::unique_ptr<sdalloc_pool> finish(const ShimConfig& config, Stack stack,
                                     std::unique_ptr<StreamEvents> events, std::size_t total) {
  const std::size_t cap = cap_for(config, config.memory_fraction, total);
  stack.push_back(std::make_unique<LimitResource>(*stack.back(), limit_for(cap)));
  if (config.mode == Mode::kPlanned) {
    PlannedArenaOptions options = sdalloc::config::planned_arena_options(config);
    // Host arenas are faulted in when reserved, so a planned step does not pay it.
    options.prefault_host_arena = config.backend == Backend::kHost;
    return std::make_unique<sdalloc_pool>(std::move(stack), std::move(events), options);
  }
  return std::make_unique<sdalloc_pool>(std::move(stack), std::move(events), config.pool);
}

// segments:chunked: the stack starts with ranges of chunks over `memory`, which the pool
// handle then owns (destroyed after the stack).
std::unique_ptr<sdalloc_pool> finish_chunked(const ShimConfig& config,
                                             std::unique_ptr<VirtualMemory> memory,
                                             std::unique_ptr<StreamEvents> events,
                                             std::size_t total) {
  Stack stack;
  stack.push_back(std::make_unique<VirtualMemoryResource>(*memory));
  std::unique_ptr<sdalloc_pool> pool = finish(config, std::move(stack), std::move(events), total);
  pool->virtual_memory = std::move(memory);
  return pool;
}

#if SDALLOC_TORCH_WITH_CUDA
std::unique_ptr<sdalloc_pool> make_cuda_pool(const ShimConfig& config, int device) {
  if (!cuda::available()) {
    throw InvalidArgument("backend:cuda, but CUDA is not usable here: " +
                          cuda::unavailable_reason() + " (backend:host uses host memory)");
  }
  Stack stack;
  switch (config.mode) {
    case Mode::kPool:
    case Mode::kPlanned:
      if (config.segments == Segments::kChunked) {
        // Unmap waits for the segment's own stream, as in mode:vmm below.
        cuda::CudaVirtualMemoryOptions options;
        options.unmap_wait = cuda::UnmapWait::kStream;
        auto memory = std::make_unique<cuda::CudaVirtualMemory>(device, options);
        const std::size_t total = memory->physical_capacity();
        return finish_chunked(config, std::move(memory),
                              std::make_unique<cuda::CudaStreamEvents>(device), total);
      }
      stack.push_back(std::make_unique<cuda::CudaResource>(device));
      break;
    case Mode::kAsync:
      stack.push_back(std::make_unique<cuda::CudaAsyncResource>(device));
      break;
    case Mode::kVmm: {
      // Unmap waits for the page's own stream, not the whole device (the default): the pool
      // gives a page up only once the events of its cross-stream frees (record_stream) have
      // completed, or its stream is idle, so the stream it names is the only work left that
      // may use the page. A device-wide synchronise per 2 MiB page would stall every stream
      // whenever a steady-state step moves pages.
      cuda::CudaVirtualMemoryOptions options;
      options.unmap_wait = cuda::UnmapWait::kStream;
      return make_vm_pool(config, std::make_unique<cuda::CudaVirtualMemory>(device, options),
                          std::make_unique<cuda::CudaStreamEvents>(device));
    }
  }
  const std::size_t total = stack.front()->capacity();
  return finish(config, std::move(stack), std::make_unique<cuda::CudaStreamEvents>(device), total);
}
#endif

}  // namespace

std::unique_ptr<sdalloc_pool> make_device_pool(const ShimConfig& config, int device) {
  if (config.backend == Backend::kHost) {
    if (config.mode == Mode::kVmm) {
      return make_vm_pool(config, std::make_unique<HostVirtualMemory>(), nullptr);
    }
    if (config.segments == Segments::kChunked) {
      return finish_chunked(config, std::make_unique<HostVirtualMemory>(), nullptr,
                            config.capacity);
    }
    Stack stack;
    stack.push_back(std::make_unique<HostResource>());
    return finish(config, std::move(stack), nullptr, config.capacity);
  }
#if SDALLOC_TORCH_WITH_CUDA
  if (device < 0) {
    throw InvalidArgument("device " + std::to_string(device) +
                          " is not a CUDA device (only backend:host serves device -1)");
  }
  return make_cuda_pool(config, device);
#else
  (void)device;
  throw InvalidArgument(
      "this libsdalloc_torch.so was built without CUDA: only backend:host is available "
      "(rebuild with the CUDA toolkit for device memory)");
#endif
}

}  // namespace sdalloc::torch_shim
