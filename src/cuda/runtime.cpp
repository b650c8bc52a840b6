// runtime.cpp - whether CUDA is usable here, asked of the statically linked runtime.
#include "sdalloc/cuda/runtime.hpp"

#include <cuda_runtime_api.h>

#include "cuda_call.hpp"

namespace sdalloc::cuda {

int device_count() {
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

bool available() { return device_count() > 0; }

std::string unavailable_reason() {
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    return "cudaGetDeviceCount failed: " + detail::describe(rc);
  }
  return count > 0 ? std::string() : std::string("no CUDA device");
}

int runtime_version() {
  int version = 0;
  if (cudaRuntimeGetVersion(&version) != cudaSuccess) return 0;
  return version;
}

int driver_version() {
  int version = 0;
  if (cudaDriverGetVersion(&version) != cudaSuccess) return 0;
  return version;
}

StreamCapture stream_capture(void* stream) noexcept {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status) != cudaSuccess) {
    (void)cudaGetLastError();
    return StreamCapture::kUnknown;
  }
  switch (status) {
    case cudaStreamCaptureStatusNone:
      return StreamCapture::kNone;
    case cudaStreamCaptureStatusActive:
      return StreamCapture::kActive;
    case cudaStreamCaptureStatusInvalidated:
      return StreamCapture::kInvalidated;
  }
  return StreamCapture::kUnknown;
}

}  // namespace sdalloc::cuda
