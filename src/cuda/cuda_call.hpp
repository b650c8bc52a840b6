// cuda_call.hpp - how sdalloc_cuda calls the CUDA runtime: error reports and the device.
//
// Every CUDA call goes through check() (or an explicit test of its result), so every
// failure becomes a CudaError that names who called, which function failed, and CUDA's
// error name and text. DeviceGuard makes a device current for one call and restores the
// caller's device, so sdalloc never changes a thread's CUDA state behind its back.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

namespace sdalloc::cuda::detail {

// "cudaErrorNoDevice (no CUDA-capable device is detected)", plus a hint when the error
// means there is no usable driver or device on this machine.
std::string describe(cudaError_t rc);

// Throws CudaError "<who>: <call> failed: <describe(rc)>". Clears the runtime's last error
// first, so a non-sticky failure does not surface again in someone else's
// cudaGetLastError().
[[noreturn]] void throw_error(const std::string& who, const char* call, cudaError_t rc);

inline void check(cudaError_t rc, const std::string& who, const char* call) {
  if (rc != cudaSuccess) throw_error(who, call, rc);
}

// Throws OutOfMemory for cudaErrorMemoryAllocation (after clearing it), CudaError for any
// other failure.
void check_allocation(cudaError_t rc, const std::string& who, const char* call, std::size_t bytes,
                      std::size_t capacity);

// True for the errors a free may meet while the process exits (the runtime has already
// been torn down): nothing can be freed then and nothing needs to be.
inline bool is_shutdown(cudaError_t rc) {
  return rc == cudaErrorCudartUnloading || rc == cudaErrorContextIsDestroyed;
}

// Checks that CUDA works and `device` exists: CudaError naming cudaGetDeviceCount's failure
// (no driver, no device), InvalidArgument for a device out of range.
void require_device(int device, const std::string& who);

// Total memory of `device` in bytes.
std::size_t device_memory(int device, const std::string& who);

// The two runtime calls DeviceGuard makes; tests pass fakes (a runtime tearing down).
struct DeviceCalls {
  cudaError_t (*get_device)(int* device) = &cudaGetDevice;
  cudaError_t (*set_device)(int device) = &cudaSetDevice;
};

// Makes `device` the calling thread's current device until destruction, then restores the
// previous one. Costs two cheap thread-local runtime calls when the device is already
// current. While the process exits (cudaGetDevice meets is_shutdown()), the guard does
// nothing and does not throw: the call it guards meets the same error and handles it (a
// free at exit returns quietly) instead of the guard throwing out of a destructor's path.
class DeviceGuard {
 public:
  DeviceGuard(int device, const std::string& who, DeviceCalls calls = {});
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  DeviceCalls calls_;
  int previous_ = -1;
  bool changed_ = false;
};

}  // namespace sdalloc::cuda::detail
