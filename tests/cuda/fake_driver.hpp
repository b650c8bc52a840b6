// fake_driver.hpp - a DriverApi whose cuMem* functions simulate the driver on the host.
//
// Address ranges, chunks and mappings are kept in tables (no memory is touched); each
// function can be told to fail once with a chosen CUresult, and every call is logged in
// order ("cuMemMap", "sync_device 0", ...), so tests can check rollback and the waits
// before cuMemUnmap. One FakeDriver is active at a time (the DriverApi holds plain
// function pointers, which reach it through a global). Not thread-safe: single-threaded
// tests only.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "driver_api.hpp"

namespace sdalloc::cuda::test {

class FakeDriver {
 public:
  static constexpr std::size_t kGranularity = std::size_t{2} << 20;

  FakeDriver() {
    active() = this;
    api_.mem_create = &mem_create;
    api_.mem_release = &mem_release;
    api_.mem_address_reserve = &mem_address_reserve;
    api_.mem_address_free = &mem_address_free;
    api_.mem_map = &mem_map;
    api_.mem_unmap = &mem_unmap;
    api_.mem_set_access = &mem_set_access;
    api_.mem_get_allocation_granularity = &granularity;
    api_.get_error_name = &error_name;
    api_.get_error_string = &error_string;
    api_.synchronize_device = &synchronize_device;
    api_.synchronize_stream = &synchronize_stream;
  }
  ~FakeDriver() { active() = nullptr; }
  FakeDriver(const FakeDriver&) = delete;
  FakeDriver& operator=(const FakeDriver&) = delete;

  const detail::DriverApi& api() const { return api_; }

  // The next call of `function` ("cuMemMap", "sync_device", ...) fails with `rc`.
  void fail_next(const std::string& function, int rc) { failures_[function] = rc; }

  std::vector<std::string> log;               // every call, in order
  std::map<CUdeviceptr, std::size_t> ranges;  // reserved
  std::map<CUmemGenericAllocationHandle, std::size_t> chunks;
  std::map<CUdeviceptr, std::size_t> mappings;
  std::map<CUdeviceptr, std::vector<int>> access;  // devices given access per mapping

 private:
  static FakeDriver*& active() {
    static FakeDriver* driver = nullptr;
    return driver;
  }
  static FakeDriver& self() { return *active(); }

  // Logs the call; answers the failure the test asked for, or 0.
  static int failure(const std::string& function, const std::string& detail = {}) {
    FakeDriver& d = self();
    d.log.push_back(detail.empty() ? function : function + " " + detail);
    auto it = d.failures_.find(function);
    if (it == d.failures_.end()) return 0;
    const int rc = it->second;
    d.failures_.erase(it);
    return rc;
  }

  static CUresult mem_create(CUmemGenericAllocationHandle* handle, size_t size,
                             const CUmemAllocationProp* prop, unsigned long long /*flags*/) {
    if (int rc = failure("cuMemCreate")) return static_cast<CUresult>(rc);
    if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    FakeDriver& d = self();
    *handle = d.next_handle_++;
    d.chunks[*handle] = size;
    return CUDA_SUCCESS;
  }
  static CUresult mem_release(CUmemGenericAllocationHandle handle) {
    if (int rc = failure("cuMemRelease")) return static_cast<CUresult>(rc);
    return self().chunks.erase(handle) == 1 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  }
  static CUresult mem_address_reserve(CUdeviceptr* ptr, size_t size, size_t alignment,
                                      CUdeviceptr /*addr*/, unsigned long long /*flags*/) {
    if (int rc = failure("cuMemAddressReserve")) return static_cast<CUresult>(rc);
    FakeDriver& d = self();
    d.next_address_ = (d.next_address_ + alignment - 1) / alignment * alignment;
    *ptr = d.next_address_;
    d.next_address_ += size + kGranularity;  // a gap, so ranges never touch
    d.ranges[*ptr] = size;
    return CUDA_SUCCESS;
  }
  static CUresult mem_address_free(CUdeviceptr ptr, size_t /*size*/) {
    if (int rc = failure("cuMemAddressFree")) return static_cast<CUresult>(rc);
    return self().ranges.erase(ptr) == 1 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  }
  static CUresult mem_map(CUdeviceptr ptr, size_t size, size_t /*offset*/,
                          CUmemGenericAllocationHandle handle, unsigned long long /*flags*/) {
    if (int rc = failure("cuMemMap")) return static_cast<CUresult>(rc);
    FakeDriver& d = self();
    if (d.chunks.count(handle) == 0 || d.mappings.count(ptr) != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    d.mappings[ptr] = size;
    return CUDA_SUCCESS;
  }
  static CUresult mem_unmap(CUdeviceptr ptr, size_t /*size*/) {
    if (int rc = failure("cuMemUnmap")) return static_cast<CUresult>(rc);
    FakeDriver& d = self();
    d.access.erase(ptr);
    return d.mappings.erase(ptr) == 1 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  }
  static CUresult mem_set_access(CUdeviceptr ptr, size_t /*size*/, const CUmemAccessDesc* desc,
                                 size_t count) {
    if (int rc = failure("cuMemSetAccess")) return static_cast<CUresult>(rc);
    std::vector<int> devices;
    for (size_t i = 0; i < count; ++i) {
      if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) return CUDA_ERROR_INVALID_VALUE;
      devices.push_back(desc[i].location.id);
    }
    self().access[ptr] = devices;
    return CUDA_SUCCESS;
  }
  static CUresult granularity(size_t* granularity, const CUmemAllocationProp* /*prop*/,
                              CUmemAllocationGranularity_flags /*option*/) {
    if (int rc = failure("cuMemGetAllocationGranularity")) return static_cast<CUresult>(rc);
    *granularity = kGranularity;
    return CUDA_SUCCESS;
  }
  static CUresult error_name(CUresult error, const char** text) {
    *text = error == CUDA_ERROR_OUT_OF_MEMORY   ? "CUDA_ERROR_OUT_OF_MEMORY"
            : error == CUDA_ERROR_INVALID_VALUE ? "CUDA_ERROR_INVALID_VALUE"
                                                : "CUDA_ERROR_FAKE";
    return CUDA_SUCCESS;
  }
  static CUresult error_string(CUresult /*error*/, const char** text) {
    *text = "simulated failure";
    return CUDA_SUCCESS;
  }
  static cudaError_t synchronize_device(int device) {
    return static_cast<cudaError_t>(failure("sync_device", std::to_string(device)));
  }
  static cudaError_t synchronize_stream(cudaStream_t stream) {
    return static_cast<cudaError_t>(
        failure("sync_stream", std::to_string(reinterpret_cast<std::uintptr_t>(stream))));
  }

  detail::DriverApi api_;
  std::map<std::string, int> failures_;
  CUmemGenericAllocationHandle next_handle_ = 1;
  CUdeviceptr next_address_ = CUdeviceptr{1} << 40;
};

}  // namespace sdalloc::cuda::test
