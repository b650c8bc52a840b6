// cuda_call.cpp - CUDA error reports, device checks and the device guard.
#include "cuda_call.hpp"

#include "sdalloc/core/errors.hpp"
#include "sdalloc/cuda/cuda_error.hpp"

namespace sdalloc::cuda::detail {

namespace {

bool means_no_device(cudaError_t rc) {
  return rc == cudaErrorNoDevice || rc == cudaErrorInsufficientDriver ||
         rc == cudaErrorInitializationError || rc == cudaErrorSystemDriverMismatch ||
         rc == cudaErrorCompatNotSupportedOnDevice;
}

}  // namespace

std::string describe(cudaError_t rc) {
  std::string text = std::string(cudaGetErrorName(rc)) + " (" + cudaGetErrorString(rc) + ")";
  if (means_no_device(rc)) text += ": no usable CUDA driver or device here";
  return text;
}

void throw_error(const std::string& who, const char* call, cudaError_t rc) {
  (void)cudaGetLastError();
  throw CudaError(who + ": " + call + " failed: " + describe(rc), call, static_cast<int>(rc));
}

void check_allocation(cudaError_t rc, const std::string& who, const char* call, std::size_t bytes,
                      std::size_t capacity) {
  if (rc == cudaSuccess) return;
  if (rc == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    OutOfMemoryInfo info;
    info.requested = bytes;
    info.capacity = capacity;
    throw OutOfMemory::describe(who, info, std::string(call) + " reported " + describe(rc));
  }
  throw_error(who, call, rc);
}

void require_device(int device, const std::string& who) {
  int count = 0;
  check(cudaGetDeviceCount(&count), who, "cudaGetDeviceCount");
  if (device < 0 || device >= count) {
    throw InvalidArgument(who + ": CUDA device " + std::to_string(device) +
                          " does not exist (this machine has " + std::to_string(count) +
                          " CUDA device" + (count == 1 ? "" : "s") + ")");
  }
}

std::size_t device_memory(int device, const std::string& who) {
  cudaDeviceProp props{};
  check(cudaGetDeviceProperties(&props, device), who, "cudaGetDeviceProperties");
  return props.totalGlobalMem;
}

DeviceGuard::DeviceGuard(int device, const std::string& who, DeviceCalls calls) : calls_(calls) {
  const cudaError_t rc = calls_.get_device(&previous_);
  if (is_shutdown(rc)) {
    (void)cudaGetLastError();
    return;  // the runtime is going away: the guarded call reports it (see the header)
  }
  check(rc, who, "cudaGetDevice");
  if (previous_ != device) {
    check(calls_.set_device(device), who, "cudaSetDevice");
    changed_ = true;
  }
}

DeviceGuard::~DeviceGuard() {
  if (changed_) (void)calls_.set_device(previous_);
}

}  // namespace sdalloc::cuda::detail
