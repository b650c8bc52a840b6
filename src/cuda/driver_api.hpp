// driver_api.hpp - the CUDA driver functions sdalloc_cuda uses, found at run time.
//
// The driver API (cuMem*) lives in libcuda.so, which only machines with an NVIDIA driver
// have. Linking it would stop every sdalloc program from starting elsewhere, so these
// functions are looked up through the statically linked runtime
// (cudaGetDriverEntryPointByVersion), which has already loaded the driver when it works.
// DriverApi is that table of function pointers. Tests fill one with fakes to drive
// DriverVirtualMemory's error and rollback paths on a machine without a GPU.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <string>

namespace sdalloc::cuda::detail {

struct DriverApi {
  CUresult (*mem_create)(CUmemGenericAllocationHandle* handle, size_t size,
                         const CUmemAllocationProp* prop, unsigned long long flags) = nullptr;
  CUresult (*mem_release)(CUmemGenericAllocationHandle handle) = nullptr;
  CUresult (*mem_address_reserve)(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                  unsigned long long flags) = nullptr;
  CUresult (*mem_address_free)(CUdeviceptr ptr, size_t size) = nullptr;
  CUresult (*mem_map)(CUdeviceptr ptr, size_t size, size_t offset,
                      CUmemGenericAllocationHandle handle, unsigned long long flags) = nullptr;
  CUresult (*mem_unmap)(CUdeviceptr ptr, size_t size) = nullptr;
  CUresult (*mem_set_access)(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc,
                             size_t count) = nullptr;
  CUresult (*mem_get_allocation_granularity)(size_t* granularity, const CUmemAllocationProp* prop,
                                             CUmemAllocationGranularity_flags option) = nullptr;
  CUresult (*get_error_name)(CUresult error, const char** text) = nullptr;
  CUresult (*get_error_string)(CUresult error, const char** text) = nullptr;
  // Runtime side: waiting for a device's or a stream's work before an unmap.
  cudaError_t (*synchronize_device)(int device) = nullptr;
  cudaError_t (*synchronize_stream)(cudaStream_t stream) = nullptr;

  // The driver's functions, looked up once per process (thread-safe). Throws CudaError
  // naming the runtime's failure (no driver) or the symbol the driver lacks.
  static const DriverApi& load(const std::string& who);

  // "CUDA_ERROR_OUT_OF_MEMORY (out of memory)", or the number when the driver cannot say.
  std::string describe(CUresult rc) const;
};

}  // namespace sdalloc::cuda::detail
