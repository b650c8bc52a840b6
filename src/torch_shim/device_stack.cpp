// device_stack.cpp - building one device's resource stack for the PyTorch shim.
#include "device_stack.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "sdalloc/errors.hpp"
#include "sdalloc/host_resource.hpp"

#if SDALLOC_TORCH_WITH_CUDA
#include "sdalloc/cuda/cuda_async_resource.hpp"
#include "sdalloc/cuda/cuda_resource.hpp"
#include "sdalloc/cuda/cuda_stream_events.hpp"
#include "sdalloc/cuda/runtime.hpp"
#endif

namespace sdalloc::torch_shim {

bool built_with_cuda() { return SDALLOC_TORCH_WITH_CUDA != 0; }

std::size_t cap_for(const ShimConfig& config, double fraction, std::size_t total) {
  std::size_t cap = config.capacity;
  if (fraction > 0.0 && total > 0) {
    const auto share = static_cast<std::size_t>(std::floor(fraction * static_cast<double>(total)));
    cap = cap == 0 ? share : std::min(cap, share);
  }
  return cap;
}

AdjustableLimitResource& limit_of(sdalloc_pool& pool) {
  return static_cast<AdjustableLimitResource&>(*pool.resources.at(1));
}

std::size_t fraction_base(const ShimConfig& config, const sdalloc_pool& pool) {
  return config.backend == Backend::kHost ? config.capacity : pool.resources.front()->capacity();
}

namespace {

using Stack = std::vector<std::unique_ptr<MemoryResource>>;

std::unique_ptr<sdalloc_pool> finish(const ShimConfig& config, Stack stack,
                                     std::unique_ptr<StreamEvents> events, std::size_t total) {
  const std::size_t cap = cap_for(config, config.memory_fraction, total);
  stack.push_back(std::make_unique<AdjustableLimitResource>(*stack.back(), cap));
  return std::make_unique<sdalloc_pool>(std::move(stack), std::move(events), config.pool);
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
      stack.push_back(std::make_unique<cuda::CudaResource>(device));
      break;
    case Mode::kAsync:
      stack.push_back(std::make_unique<cuda::CudaAsyncResource>(device));
      break;
    case Mode::kVmm:
      // VirtualMemoryPool over CudaVirtualMemory is a pool of its own, not a source under
      // a CachingPool; the C API handle does not carry it yet.
      throw InvalidArgument(
          "mode:vmm is not available in the PyTorch shim yet (use mode:pool or mode:async)");
  }
  const std::size_t total = stack.front()->capacity();
  return finish(config, std::move(stack), std::make_unique<cuda::CudaStreamEvents>(device),
                total);
}
#endif

}  // namespace

std::unique_ptr<sdalloc_pool> make_device_pool(const ShimConfig& config, int device) {
  if (config.backend == Backend::kHost) {
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
