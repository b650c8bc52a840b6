// sdalloc/cuda/cuda_error.hpp - the error every CUDA call of sdalloc reports.
//
// When a CUDA runtime or driver call fails for a reason other than "out of memory", sdalloc
// throws CudaError. Its message names the sdalloc object that made the call, the CUDA
// function, and CUDA's own error name and text, e.g.
//   "cuda(0): cudaSetDevice failed: cudaErrorInsufficientDriver (CUDA driver version is
//    insufficient for CUDA runtime version): no usable CUDA driver or device here"
// `call` and `code` carry the same facts for programs (code is the cudaError_t value, or the
// CUresult value for driver calls, which name themselves "cu...").
// Out of device memory is OutOfMemory (sdalloc/core/errors.hpp), like every other resource's.
#pragma once

#include <string>
#include <utility>

#include "sdalloc/core/errors.hpp"

namespace sdalloc::cuda {

class CudaError : public Error {
 public:
  CudaError(const std::string& what, std::string failed_call, int error_code)
      : Error(what), call(std::move(failed_call)), code(error_code) {}
  std::string call;  // e.g. "cudaMalloc", "cuMemMap"
  int code;          // cudaError_t or CUresult
};

}  // namespace sdalloc::cuda
