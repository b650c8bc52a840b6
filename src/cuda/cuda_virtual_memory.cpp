// cuda_virtual_memory.cpp - the public CudaVirtualMemory: checks the device and its peers,
// finds the driver's functions, and makes the device current around each call.
#include "sdalloc/cuda/cuda_virtual_memory.hpp"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <utility>

#include "cuda_call.hpp"
#include "driver_api.hpp"
#include "driver_virtual_memory.hpp"
#include "sdalloc/core/errors.hpp"
#include "sdalloc/cuda/cuda_error.hpp"

namespace sdalloc::cuda {

namespace {

std::string vm_name(int device) { return "cuda-vm(device " + std::to_string(device) + ")"; }

// The device first, then each peer once; throws InvalidArgument for a bad peer.
std::vector<int> access_devices(int device, const std::vector<int>& peers, const std::string& who) {
  std::vector<int> devices{device};
  for (int peer : peers) {
    if (peer == device) {
      throw InvalidArgument(who + ": peer device " + std::to_string(peer) +
                            " is the owning device itself");
    }
    detail::require_device(peer, who);
    int can_access = 0;
    detail::check(cudaDeviceCanAccessPeer(&can_access, peer, device), who,
                  "cudaDeviceCanAccessPeer");
    if (can_access == 0) {
      throw InvalidArgument(who + ": device " + std::to_string(peer) +
                            " cannot access the memory of device " + std::to_string(device) +
                            " (cudaDeviceCanAccessPeer is 0)");
    }
    if (std::find(devices.begin(), devices.end(), peer) == devices.end()) {
      devices.push_back(peer);
    }
  }
  return devices;
}

}  // namespace

CudaVirtualMemory::CudaVirtualMemory(int device, CudaVirtualMemoryOptions options)
    : device_(device), options_(std::move(options)) {
  const std::string who = vm_name(device);
  detail::require_device(device, who);
  std::vector<int> devices = access_devices(device, options_.peer_devices, who);
  const std::size_t capacity = detail::device_memory(device, who);
  // The runtime has no name for this attribute, but its values are the driver's.
  int supported = 0;
  const auto attribute =
      static_cast<cudaDeviceAttr>(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED);
  if (cudaDeviceGetAttribute(&supported, attribute, device) == cudaSuccess && supported == 0) {
    throw CudaError(who +
                        ": the device does not support virtual memory management "
                        "(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0)",
                    "cudaDeviceGetAttribute", static_cast<int>(cudaErrorNotSupported));
  }
  (void)cudaGetLastError();
  const detail::DriverApi& api = detail::DriverApi::load(who);
  const detail::DeviceGuard guard(device, who);
  impl_ = std::make_unique<DriverVirtualMemory>(api, device, std::move(devices),
                                                options_.unmap_wait, capacity, who);
}

CudaVirtualMemory::~CudaVirtualMemory() {
  // The driver calls of the cleanup need the device's context current.
  int previous = -1;
  const bool switched = cudaGetDevice(&previous) == cudaSuccess && previous != device_ &&
                        cudaSetDevice(device_) == cudaSuccess;
  impl_.reset();
  if (switched) (void)cudaSetDevice(previous);
}

std::string CudaVirtualMemory::name() const { return vm_name(device_); }
std::size_t CudaVirtualMemory::granularity() const { return impl_->granularity(); }
std::size_t CudaVirtualMemory::physical_capacity() const { return impl_->physical_capacity(); }

void* CudaVirtualMemory::reserve(std::size_t bytes, std::size_t alignment) {
  const detail::DeviceGuard guard(device_, impl_->name());
  return impl_->reserve(bytes, alignment);
}

void CudaVirtualMemory::release(void* base, std::size_t bytes) {
  const detail::DeviceGuard guard(device_, impl_->name());
  impl_->release(base, bytes);
}

PhysicalChunk CudaVirtualMemory::create(std::size_t bytes) {
  const detail::DeviceGuard guard(device_, impl_->name());
  return impl_->create(bytes);
}

void CudaVirtualMemory::destroy(PhysicalChunk chunk) {
  const detail::DeviceGuard guard(device_, impl_->name());
  impl_->destroy(chunk);
}

void CudaVirtualMemory::map(void* address, PhysicalChunk chunk) {
  const detail::DeviceGuard guard(device_, impl_->name());
  impl_->map(address, chunk);
}

void CudaVirtualMemory::unmap(void* address, std::size_t bytes, Stream last_use) {
  const detail::DeviceGuard guard(device_, impl_->name());
  impl_->unmap(address, bytes, last_use);
}

std::size_t CudaVirtualMemory::physical_bytes() const { return impl_->physical_bytes(); }
std::size_t CudaVirtualMemory::mapped_bytes() const { return impl_->mapped_bytes(); }
std::size_t CudaVirtualMemory::reserved_bytes() const { return impl_->reserved_bytes(); }

}  // namespace sdalloc::cuda
