// cuda_async_resource.cpp - stream-ordered device memory from a pool of its own.
#include "sdalloc/cuda/cuda_async_resource.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda_call.hpp"
#include "sdalloc/cuda/cuda_error.hpp"

namespace sdalloc::cuda {

namespace {

cudaStream_t native(Stream stream) { return stream.as_native<CUstream_st>(); }

}  // namespace

CudaAsyncResource::CudaAsyncResource(int device, CudaAsyncResourceOptions options)
    : device_(device), name_("cuda_async(" + std::to_string(device) + ")"), options_(options) {
  const std::string& who = name_;
  detail::require_device(device, who);
  capacity_ = detail::device_memory(device, who);
  int supported = 0;
  detail::check(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device), who,
                "cudaDeviceGetAttribute(cudaDevAttrMemoryPoolsSupported)");
  if (supported == 0) {
    throw CudaError(who +
                        ": the device does not support stream-ordered memory pools "
                        "(cudaDevAttrMemoryPoolsSupported is 0)",
                    "cudaDeviceGetAttribute", static_cast<int>(cudaErrorNotSupported));
  }

  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool = nullptr;
  detail::check(cudaMemPoolCreate(&pool, &props), who, "cudaMemPoolCreate");
  pool_ = pool;
  try {
    std::uint64_t threshold = options.release_threshold;
    detail::check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold), who,
                  "cudaMemPoolSetAttribute(cudaMemPoolAttrReleaseThreshold)");
    if (options.initial_pool_size > 0) {
      // Allocate and free once on the legacy stream, then wait: the freed memory stays in
      // the pool (up to the release threshold) and later requests are served from it.
      const detail::DeviceGuard guard(device, who);
      void* warm = nullptr;
      detail::check_allocation(
          cudaMallocFromPoolAsync(&warm, options.initial_pool_size, pool, nullptr), who,
          "cudaMallocFromPoolAsync", options.initial_pool_size, capacity_);
      detail::check(cudaFreeAsync(warm, nullptr), who, "cudaFreeAsync");
      detail::check(cudaStreamSynchronize(nullptr), who, "cudaStreamSynchronize");
    }
  } catch (...) {
    (void)cudaMemPoolDestroy(pool);
    throw;
  }
}

CudaAsyncResource::~CudaAsyncResource() {
  // Memory still allocated from the pool keeps it alive in the driver until freed.
  (void)cudaMemPoolDestroy(static_cast<cudaMemPool_t>(pool_));
}

std::string CudaAsyncResource::name() const { return name_; }

void* CudaAsyncResource::do_allocate(std::size_t bytes, Stream stream) {
  if (bytes == 0) return nullptr;
  const detail::DeviceGuard guard(device_, name_);
  void* ptr = nullptr;
  detail::check_allocation(
      cudaMallocFromPoolAsync(&ptr, bytes, static_cast<cudaMemPool_t>(pool_), native(stream)),
      name_, "cudaMallocFromPoolAsync", bytes, capacity_);
  return ptr;
}

void CudaAsyncResource::do_deallocate(void* ptr, std::size_t /*bytes*/, Stream stream) {
  if (ptr == nullptr) return;
  const detail::DeviceGuard guard(device_, name_);
  const cudaError_t rc = cudaFreeAsync(ptr, native(stream));
  if (rc == cudaSuccess || detail::is_shutdown(rc)) return;
  detail::throw_error(name_, "cudaFreeAsync", rc);
}

void CudaAsyncResource::trim(std::size_t keep_bytes) {
  detail::check(cudaMemPoolTrimTo(static_cast<cudaMemPool_t>(pool_), keep_bytes), name_,
                "cudaMemPoolTrimTo");
}

std::size_t CudaAsyncResource::reserved_bytes() const {
  std::uint64_t bytes = 0;
  detail::check(cudaMemPoolGetAttribute(static_cast<cudaMemPool_t>(pool_),
                                        cudaMemPoolAttrReservedMemCurrent, &bytes),
                name_, "cudaMemPoolGetAttribute(cudaMemPoolAttrReservedMemCurrent)");
  return static_cast<std::size_t>(bytes);
}

}  // namespace sdalloc::cuda
