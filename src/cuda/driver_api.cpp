// driver_api.cpp - looking up the driver's cuMem* functions through the runtime.
#include "driver_api.hpp"

#include <mutex>

#include "cuda_call.hpp"
#include "sdalloc/cuda/cuda_error.hpp"

namespace sdalloc::cuda::detail {

namespace {

// Entry points are looked up as of CUDA 12.0 (cudaGetDriverEntryPointByVersion, CUDA 12.5
// and later; older toolkits have only cudaGetDriverEntryPoint, which gives the runtime's own
// version): the cuMem* functions have kept their signatures since 10.2, and any driver that
// runs this runtime provides them.
constexpr unsigned kEntryPointVersion = 12000;

template <typename Function>
void look_up(const char* symbol, Function*& slot, const std::string& who) {
  void* found = nullptr;
#if CUDART_VERSION >= 12050
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t rc = cudaGetDriverEntryPointByVersion(symbol, &found, kEntryPointVersion,
                                                          cudaEnableDefault, &status);
#elif CUDART_VERSION >= 12000
  // Before 12.5 the lookup gives the version matching the runtime sdalloc was built with.
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t rc = cudaGetDriverEntryPoint(symbol, &found, cudaEnableDefault, &status);
#else
  const cudaError_t rc = cudaGetDriverEntryPoint(symbol, &found, cudaEnableDefault);
  const bool status_found = found != nullptr;
#endif
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    throw CudaError(who + ": cudaGetDriverEntryPoint(" + symbol + ") failed: " + describe(rc),
                    "cudaGetDriverEntryPoint", static_cast<int>(rc));
  }
#if CUDART_VERSION >= 12000
  const bool status_found = status == cudaDriverEntryPointSuccess;
  const char* why = status == cudaDriverEntryPointVersionNotSufficent ? " (driver too old)"
                                                                      : " (symbol not found)";
#else
  const char* why = " (symbol not found)";
#endif
  if (!status_found || found == nullptr) {
    throw CudaError(who + ": the CUDA driver does not provide " + symbol + why,
                    "cudaGetDriverEntryPoint", static_cast<int>(cudaErrorSymbolNotFound));
  }
  slot = reinterpret_cast<Function*>(found);
}

cudaError_t synchronize_device(int device) {
  int previous = 0;
  cudaError_t rc = cudaGetDevice(&previous);
  if (rc != cudaSuccess) return rc;
  if (previous != device && (rc = cudaSetDevice(device)) != cudaSuccess) return rc;
  rc = cudaDeviceSynchronize();
  if (previous != device) (void)cudaSetDevice(previous);
  return rc;
}

cudaError_t synchronize_stream(cudaStream_t stream) { return cudaStreamSynchronize(stream); }

DriverApi load_all(const std::string& who) {
  DriverApi api;
  look_up("cuMemCreate", api.mem_create, who);
  look_up("cuMemRelease", api.mem_release, who);
  look_up("cuMemAddressReserve", api.mem_address_reserve, who);
  look_up("cuMemAddressFree", api.mem_address_free, who);
  look_up("cuMemMap", api.mem_map, who);
  look_up("cuMemUnmap", api.mem_unmap, who);
  look_up("cuMemSetAccess", api.mem_set_access, who);
  look_up("cuMemGetAllocationGranularity", api.mem_get_allocation_granularity, who);
  look_up("cuGetErrorName", api.get_error_name, who);
  look_up("cuGetErrorString", api.get_error_string, who);
  api.synchronize_device = &synchronize_device;
  api.synchronize_stream = &synchronize_stream;
  return api;
}

}  // namespace

const DriverApi& DriverApi::load(const std::string& who) {
  // Looked up once; a failure (no driver) is not remembered, so each caller gets the error
  // with its own name, and a later call may succeed.
  static std::mutex mutex;
  static DriverApi api;
  static bool loaded = false;
  std::lock_guard lock(mutex);
  if (!loaded) {
    api = load_all(who);
    loaded = true;
  }
  return api;
}

std::string DriverApi::describe(CUresult rc) const {
  const char* name = nullptr;
  const char* text = nullptr;
  if (get_error_name == nullptr || get_error_name(rc, &name) != CUDA_SUCCESS) name = nullptr;
  if (get_error_string == nullptr || get_error_string(rc, &text) != CUDA_SUCCESS) {
    text = nullptr;
  }
  std::string out = name != nullptr ? name : "CUresult " + std::to_string(static_cast<int>(rc));
  if (text != nullptr) out += std::string(" (") + text + ")";
  return out;
}

}  // namespace sdalloc::cuda::detail
