// device_stack.cpp - one device's pool for the PyTorch shim (device_stack.hpp).
#include "device_stack.hpp"

#include "counting_virtual_memory.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "sdalloc/config/make_pool.hpp"
#include "sdalloc/core/errors.hpp"
#include "sdalloc/resources/host_backend.hpp"

#if SDALLOC_TORCH_WITH_CUDA
#include "sdalloc/cuda/device_resource.hpp"
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

std::uint64_t vmm_unmaps(const sdalloc_pool& pool) {
  if (pool.stack->mode != PoolMode::kVmm) return 0;
  const auto* counting =
      dynamic_cast<const CountingVirtualMemory*>(pool.stack->backend.virtual_memory.get());
  return counting == nullptr ? 0 : counting->unmaps();
}

std::size_t fraction_base(const ShimConfig& config, const sdalloc_pool& pool) {
  if (config.backend == Backend::kHost) return config.capacity;
  const MemoryBackend& memory = pool.stack->backend;
  if (pool.stack->mode == PoolMode::kVmm) return memory.virtual_memory->physical_capacity();
  return memory.segments->capacity();
}

namespace {

MemoryBackend backend_for(const ShimConfig& config, int device) {
  if (config.backend == Backend::kHost) return host_backend();
#if SDALLOC_TORCH_WITH_CUDA
  if (device < 0) {
    throw InvalidArgument("device " + std::to_string(device) +
                          " is not a CUDA device (only backend:host serves device -1)");
  }
  if (!cuda::available()) {
    throw InvalidArgument("backend:cuda, but CUDA is not usable here: " +
                          cuda::unavailable_reason() + " (backend:host uses host memory)");
  }
  std::string refused;
  MemoryBackend backend = cuda::device_backend(
      device, {.virtual_memory = true, .async_segments = config.mode == Mode::kAsync}, &refused);
  if (backend.virtual_memory == nullptr && config.mode == Mode::kVmm) {
    throw InvalidArgument("mode:vmm, but device " + std::to_string(device) +
                          " has no virtual memory here: " + refused);
  }
  return backend;
#else
  (void)device;
  throw InvalidArgument(
      "this libsdalloc_torch.so was built without CUDA: only backend:host is available "
      "(rebuild with the CUDA toolkit for device memory)");
#endif
}

}  // namespace

std::unique_ptr<sdalloc_pool> make_device_pool(const ShimConfig& config, int device) {
  MemoryBackend backend = backend_for(config, device);
  if (backend.virtual_memory != nullptr) {
    backend.virtual_memory =
        std::make_unique<CountingVirtualMemory>(std::move(backend.virtual_memory));
  }
  const std::size_t total = config.backend == Backend::kHost ? config.capacity
                            : resolve_mode(config.mode, backend) == PoolMode::kVmm
                                ? backend.virtual_memory->physical_capacity()
                                : backend.segments->capacity();
  PoolConf conf = config;
  conf.capacity = cap_for(config, config.memory_fraction, total);
  return std::make_unique<sdalloc_pool>(make_pool(conf, std::move(backend)));
}

}  // namespace sdalloc::torch_shim
