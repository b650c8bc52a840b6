// driver_virtual_memory.hpp - the logic of CudaVirtualMemory over a table of driver calls.
//
// Everything CudaVirtualMemory does except making its device current: unit and rule
// checks against its tables (the ledger HostVirtualMemory keeps too,
// resources/virtual_memory_ledger.hpp), the cuMem* calls (through a DriverApi), rollback of a map
// whose access step fails, waiting before unmap, and cleanup at destruction. Taking the DriverApi
// as a parameter lets tests give it fake driver functions that fail on command, so the
// error and rollback paths run on machines without a GPU; CudaVirtualMemory passes the real
// table. Thread-safety and errors: as cuda_virtual_memory.hpp says.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "driver_api.hpp"
#include "resources/virtual_memory_ledger.hpp"
#include "sdalloc/core/virtual_memory.hpp"
#include "sdalloc/cuda/cuda_virtual_memory.hpp"

namespace sdalloc::cuda {

class DriverVirtualMemory {
 public:
  // `access_devices`: the device first, then its peers. `capacity`: total device memory.
  DriverVirtualMemory(const detail::DriverApi& api, int device, std::vector<int> access_devices,
                      UnmapWait unmap_wait, std::size_t capacity, std::string name);
  ~DriverVirtualMemory();  // unmaps, destroys and releases what is left
  DriverVirtualMemory(const DriverVirtualMemory&) = delete;
  DriverVirtualMemory& operator=(const DriverVirtualMemory&) = delete;

  std::size_t granularity() const { return granularity_; }
  void* reserve(std::size_t bytes, std::size_t alignment);
  void release(void* base, std::size_t bytes);
  PhysicalChunk create(std::size_t bytes);
  void destroy(PhysicalChunk chunk);
  void map(void* address, PhysicalChunk chunk);
  void unmap(void* address, std::size_t bytes, Stream last_use);
  std::size_t physical_capacity() const { return capacity_; }
  const std::string& name() const { return name_; }

  std::size_t physical_bytes() const;
  std::size_t mapped_bytes() const;
  std::size_t reserved_bytes() const;

 private:
  CUmemAllocationProp allocation_properties() const;
  [[noreturn]] void fail(const char* call, CUresult rc, const std::string& detail = {}) const;
  void check_size(const char* what, std::size_t bytes) const;

  const detail::DriverApi& api_;
  int device_;
  std::vector<int> access_devices_;
  UnmapWait unmap_wait_;
  std::size_t capacity_;
  std::string name_;
  std::size_t granularity_ = 0;

  mutable std::mutex mutex_;
  sdalloc::detail::VirtualMemoryLedger ledger_;  // chunk handles are CUmemGenericAllocationHandles
};

}  // namespace sdalloc::cuda
