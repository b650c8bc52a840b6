// driver_virtual_memory.cpp - reserve, create, map and unmap device memory with cuMem*.
#include "driver_virtual_memory.hpp"

#include <iterator>
#include <utility>

#include "core/bits.hpp"
#include "cuda_call.hpp"
#include "sdalloc/core/errors.hpp"
#include "sdalloc/cuda/cuda_error.hpp"

namespace sdalloc::cuda {

namespace {

std::string hex(std::uintptr_t address) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  do {
    out.insert(out.begin(), kDigits[address & 15U]);
    address >>= 4U;
  } while (address != 0);
  return "0x" + out;
}

}  // namespace

DriverVirtualMemory::DriverVirtualMemory(const detail::DriverApi& api, int device,
                                         std::vector<int> access_devices, UnmapWait unmap_wait,
                                         std::size_t capacity, std::string name)
    : api_(api),
      device_(device),
      access_devices_(std::move(access_devices)),
      unmap_wait_(unmap_wait),
      capacity_(capacity),
      name_(std::move(name)) {
  const CUmemAllocationProp prop = allocation_properties();
  const CUresult rc =
      api_.mem_get_allocation_granularity(&granularity_, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (rc != CUDA_SUCCESS) fail("cuMemGetAllocationGranularity", rc);
  if (!is_power_of_two(granularity_)) {
    throw CudaError(name_ + ": cuMemGetAllocationGranularity answered " +
                        std::to_string(granularity_) + ", not a power of two",
                    "cuMemGetAllocationGranularity", 0);
  }
}

DriverVirtualMemory::~DriverVirtualMemory() {
  // What the caller left behind: mappings first, then chunks, then ranges (the driver
  // requires that order). Failures cannot be reported from here; the memory is then lost.
  if (!ledger_.mappings().empty()) {
    // Which streams used them is unknown here: wait for the whole device.
    (void)api_.synchronize_device(device_);
    for (const auto& [address, mapping] : ledger_.mappings()) {
      (void)api_.mem_unmap(static_cast<CUdeviceptr>(address), mapping.bytes);
    }
  }
  for (const auto& [handle, chunk] : ledger_.chunks()) {
    (void)api_.mem_release(static_cast<CUmemGenericAllocationHandle>(handle));
  }
  for (const auto& [base, bytes] : ledger_.ranges()) {
    (void)api_.mem_address_free(static_cast<CUdeviceptr>(base), bytes);
  }
}

CUmemAllocationProp DriverVirtualMemory::allocation_properties() const {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device_;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  return prop;
}

void DriverVirtualMemory::fail(const char* call, CUresult rc, const std::string& detail) const {
  std::string what = name_ + ": " + call + " failed: " + api_.describe(rc);
  if (!detail.empty()) what += "; " + detail;
  throw CudaError(what, call, static_cast<int>(rc));
}

void DriverVirtualMemory::check_size(const char* what, std::size_t bytes) const {
  if (bytes == 0 || bytes % granularity_ != 0) {
    throw InvalidArgument(name_ + ": " + what + " of " + std::to_string(bytes) +
                          " bytes: sizes must be positive multiples of the granularity (" +
                          std::to_string(granularity_) + " bytes)");
  }
}

// --- address ranges ---------------------------------------------------------------------------

void* DriverVirtualMemory::reserve(std::size_t bytes, std::size_t alignment) {
  check_size("reserve", bytes);
  if (alignment != 0 && !is_power_of_two(alignment)) {
    throw InvalidArgument(name_ + ": reserve with alignment " + std::to_string(alignment) +
                          ": must be 0 or a power of two");
  }
  if (alignment < granularity_) alignment = granularity_;
  std::lock_guard lock(mutex_);
  CUdeviceptr base = 0;
  const CUresult rc = api_.mem_address_reserve(&base, bytes, alignment, 0, 0);
  if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
    OutOfMemoryInfo info;
    info.requested = bytes;
    throw OutOfMemory::describe(
        name_, info, "cuMemAddressReserve found no free address range: " + api_.describe(rc));
  }
  if (rc != CUDA_SUCCESS) fail("cuMemAddressReserve", rc, "reserving " + format_bytes(bytes));
  try {
    ledger_.add_range(static_cast<std::uintptr_t>(base), bytes);
  } catch (...) {
    (void)api_.mem_address_free(base, bytes);
    throw;
  }
  return reinterpret_cast<void*>(static_cast<std::uintptr_t>(base));
}

void DriverVirtualMemory::release(void* base, std::size_t bytes) {
  const auto addr = reinterpret_cast<std::uintptr_t>(base);
  std::lock_guard lock(mutex_);
  if (!ledger_.is_range(addr, bytes)) {
    throw InvalidArgument(name_ + ": release of " + hex(addr) + " (" + std::to_string(bytes) +
                          " bytes), which is not a range reserve() handed out with that size");
  }
  if (ledger_.overlaps_mapping(addr, bytes)) {
    throw InvalidArgument(name_ + ": release of the range at " + hex(addr) +
                          " while chunks are still mapped in it");
  }
  const CUresult rc = api_.mem_address_free(static_cast<CUdeviceptr>(addr), bytes);
  if (rc != CUDA_SUCCESS) fail("cuMemAddressFree", rc);
  ledger_.remove_range(addr);
}

// --- physical chunks ----------------------------------------------------------------------------

PhysicalChunk DriverVirtualMemory::create(std::size_t bytes) {
  check_size("create", bytes);
  const CUmemAllocationProp prop = allocation_properties();
  std::lock_guard lock(mutex_);
  CUmemGenericAllocationHandle handle = 0;
  const CUresult rc = api_.mem_create(&handle, bytes, &prop, 0);
  if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
    OutOfMemoryInfo info;
    info.requested = bytes;
    info.reserved = ledger_.physical_bytes();
    info.capacity = capacity_;
    throw OutOfMemory::describe(name_, info, "cuMemCreate reported " + api_.describe(rc));
  }
  if (rc != CUDA_SUCCESS) fail("cuMemCreate", rc, "creating " + format_bytes(bytes));
  try {
    ledger_.add_chunk(static_cast<std::uint64_t>(handle), bytes);
  } catch (...) {
    (void)api_.mem_release(handle);
    throw;
  }
  return PhysicalChunk{static_cast<std::uint64_t>(handle), bytes};
}

void DriverVirtualMemory::destroy(PhysicalChunk chunk) {
  std::lock_guard lock(mutex_);
  const sdalloc::detail::VirtualMemoryLedger::Chunk* found =
      ledger_.find_chunk(chunk.handle, chunk.bytes);
  if (found == nullptr) {
    throw InvalidArgument(name_ + ": destroy of chunk " + std::to_string(chunk.handle) + " (" +
                          std::to_string(chunk.bytes) +
                          " bytes), which is not a chunk create() made with that size");
  }
  if (found->mapped) {
    throw InvalidArgument(name_ + ": destroy of chunk " + std::to_string(chunk.handle) +
                          " while it is mapped; unmap it first");
  }
  const CUresult rc = api_.mem_release(static_cast<CUmemGenericAllocationHandle>(chunk.handle));
  if (rc != CUDA_SUCCESS) fail("cuMemRelease", rc);
  ledger_.remove_chunk(chunk.handle);
}

// --- mappings -----------------------------------------------------------------------------------

void DriverVirtualMemory::map(void* address, PhysicalChunk chunk) {
  const auto addr = reinterpret_cast<std::uintptr_t>(address);
  std::lock_guard lock(mutex_);
  const sdalloc::detail::VirtualMemoryLedger::Chunk* found =
      ledger_.find_chunk(chunk.handle, chunk.bytes);
  if (found == nullptr) {
    throw InvalidArgument(name_ + ": map of chunk " + std::to_string(chunk.handle) + " (" +
                          std::to_string(chunk.bytes) +
                          " bytes), which is not a chunk create() made with that size");
  }
  if (found->mapped) {
    throw InvalidArgument(name_ + ": map of chunk " + std::to_string(chunk.handle) +
                          ", which is already mapped elsewhere");
  }
  const auto range = ledger_.range_holding(addr, chunk.bytes);
  if (range == ledger_.ranges().end()) {
    throw InvalidArgument(name_ + ": map at " + hex(addr) + " of " + format_bytes(chunk.bytes) +
                          ": not inside one reserved range");
  }
  if ((addr - range->first) % granularity_ != 0) {
    throw InvalidArgument(name_ + ": map at " + hex(addr) + ": offset " +
                          std::to_string(addr - range->first) +
                          " in its range is not a multiple of the granularity (" +
                          std::to_string(granularity_) + " bytes)");
  }
  if (ledger_.overlaps_mapping(addr, chunk.bytes)) {
    throw InvalidArgument(name_ + ": map at " + hex(addr) + " of " + format_bytes(chunk.bytes) +
                          " over addresses that are already mapped");
  }
  // Into the ledger first, so nothing can fail once the driver has mapped; taken out again
  // if the driver fails.
  ledger_.add_mapping(addr, chunk.handle, chunk.bytes);
  const auto ptr = static_cast<CUdeviceptr>(addr);
  const auto handle = static_cast<CUmemGenericAllocationHandle>(chunk.handle);
  CUresult rc = api_.mem_map(ptr, chunk.bytes, 0, handle, 0);
  if (rc != CUDA_SUCCESS) {
    ledger_.remove_mapping(addr);
    if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
      OutOfMemoryInfo info;
      info.requested = chunk.bytes;
      info.capacity = capacity_;
      throw OutOfMemory::describe(name_, info, "cuMemMap reported " + api_.describe(rc));
    }
    fail("cuMemMap", rc, "mapping " + format_bytes(chunk.bytes) + " at " + hex(addr));
  }
  std::vector<CUmemAccessDesc> access(access_devices_.size());
  for (std::size_t i = 0; i < access.size(); ++i) {
    access[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access[i].location.id = access_devices_[i];
    access[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  rc = api_.mem_set_access(ptr, chunk.bytes, access.data(), access.size());
  if (rc != CUDA_SUCCESS) {
    // Roll back: a mapping nobody may access is of no use, and the caller is told nothing
    // is mapped.
    const CUresult undo = api_.mem_unmap(ptr, chunk.bytes);
    if (undo == CUDA_SUCCESS) {
      ledger_.remove_mapping(addr);
      fail("cuMemSetAccess", rc, "the mapping at " + hex(addr) + " was removed again");
    }
    // The mapping stays in the ledger: it still exists, and the destructor retries.
    fail("cuMemSetAccess", rc,
         "removing the mapping at " + hex(addr) + " failed too: " + api_.describe(undo));
  }
}

void DriverVirtualMemory::unmap(void* address, std::size_t bytes, Stream last_use) {
  const auto addr = reinterpret_cast<std::uintptr_t>(address);
  auto check = [&] {
    if (ledger_.find_mapping(addr, bytes) == nullptr) {
      throw InvalidArgument(name_ + ": unmap at " + hex(addr) + " of " + format_bytes(bytes) +
                            ": no mapping made by map() starts there with that size");
    }
  };
  {
    std::lock_guard lock(mutex_);
    check();
  }
  // Work queued before this point may still use the memory: wait for it, outside the lock.
  const cudaError_t waited = unmap_wait_ == UnmapWait::kDevice
                                 ? api_.synchronize_device(device_)
                                 : api_.synchronize_stream(last_use.as_native<CUstream_st>());
  if (waited != cudaSuccess) {
    detail::throw_error(
        name_,
        unmap_wait_ == UnmapWait::kDevice ? "cudaDeviceSynchronize" : "cudaStreamSynchronize",
        waited);
  }
  std::lock_guard lock(mutex_);
  check();
  const CUresult rc = api_.mem_unmap(static_cast<CUdeviceptr>(addr), bytes);
  if (rc != CUDA_SUCCESS) fail("cuMemUnmap", rc, "unmapping " + format_bytes(bytes));
  ledger_.remove_mapping(addr);
}

std::size_t DriverVirtualMemory::physical_bytes() const {
  std::lock_guard lock(mutex_);
  return ledger_.physical_bytes();
}

std::size_t DriverVirtualMemory::mapped_bytes() const {
  std::lock_guard lock(mutex_);
  return ledger_.mapped_bytes();
}

std::size_t DriverVirtualMemory::reserved_bytes() const {
  std::lock_guard lock(mutex_);
  return ledger_.reserved_bytes();
}

}  // namespace sdalloc::cuda
