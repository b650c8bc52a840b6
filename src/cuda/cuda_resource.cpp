// cuda_resource.cpp - device memory from cudaMalloc.
#include "sdalloc/cuda/cuda_resource.hpp"

#include <cuda_runtime_api.h>

#include "cuda_call.hpp"

namespace sdalloc::cuda {

CudaResource::CudaResource(int device)
    : device_(device), name_("cuda(" + std::to_string(device) + ")") {
  const std::string& who = name_;
  detail::require_device(device, who);
  capacity_ = detail::device_memory(device, who);
}

std::string CudaResource::name() const { return name_; }

void* CudaResource::do_allocate(std::size_t bytes, Stream /*stream*/) {
  if (bytes == 0) return nullptr;
  const detail::DeviceGuard guard(device_, name_);
  void* ptr = nullptr;
  detail::check_allocation(cudaMalloc(&ptr, bytes), name_, "cudaMalloc", bytes, capacity_);
  return ptr;
}

void CudaResource::do_deallocate(void* ptr, std::size_t /*bytes*/, Stream /*stream*/) {
  if (ptr == nullptr) return;
  const detail::DeviceGuard guard(device_, name_);
  const cudaError_t rc = cudaFree(ptr);
  if (rc == cudaSuccess || detail::is_shutdown(rc)) return;
  detail::throw_error(name_, "cudaFree", rc);
}

}  // namespace sdalloc::cuda
