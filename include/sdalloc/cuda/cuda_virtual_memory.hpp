// sdalloc/cuda/cuda_virtual_memory.hpp - VirtualMemory on a CUDA device (cuMem* driver API).
//
// CudaVirtualMemory implements the VirtualMemory interface (sdalloc/core/virtual_memory.hpp) for
// one device, so a VirtualMemoryPool can stitch device memory the way it stitches host pages:
//  - reserve / release:  cuMemAddressReserve / cuMemAddressFree (address space only).
//  - create / destroy:   cuMemCreate (pinned device memory of `device`) / cuMemRelease.
//  - map:                cuMemMap, then cuMemSetAccess giving read/write access to the
//                        device and to every peer in options.peer_devices. If the access
//                        step fails, the mapping is removed again (cuMemUnmap) before the
//                        error is thrown: nothing stays mapped (the interface's rollback).
//  - unmap:              waits for work that may still use the memory, then cuMemUnmap. By
//                        default it synchronizes the whole owning device (cudaDeviceSynchronize),
//                        which also covers streams the caller did not name; with
//                        UnmapWait::kStream it waits only for `last_use`
//                        (cudaStreamSynchronize), which the interface requires as a minimum.
// The driver functions are looked up at run time through the CUDA runtime (see
// runtime.hpp), so nothing links libcuda.so.
//
// Granularity: the device's minimum allocation granularity (cuMemGetAllocationGranularity;
// 2 MiB on current GPUs). Physical capacity: the device's total memory.
//
// Like HostVirtualMemory, the object keeps a table of its ranges, chunks and mappings and
// rejects calls that break the interface's rules with InvalidArgument before any driver
// call (a map outside a reserved range, over a mapping, or at an offset that is not a
// multiple of the granularity; an unmap that matches no mapping; destroying a mapped chunk
// or a chunk of the wrong size; releasing a range that still has mappings). The destructor
// unmaps, destroys and releases whatever the caller left behind.
//
// Device: every call makes `device` current for its duration and restores the thread's
// device afterwards. Thread-safety: as virtual_memory.hpp says (concurrent calls on
// different chunks and addresses); one mutex guards the tables, and an unmap waits for the
// device outside it.
//
// Errors:
//  - constructor: CudaError without a usable driver or device, when the driver lacks the
//    cuMem* functions, or when the device does not support virtual memory management;
//    InvalidArgument for a device out of range, or a peer that does not exist, is the device
//    itself, or cannot access it (cudaDeviceCanAccessPeer).
//  - reserve, create, map: OutOfMemory for CUDA_ERROR_OUT_OF_MEMORY; CudaError (code = the
//    CUresult, call = the cu* function) for other driver failures.
//  - unmap, destroy, release: CudaError when the wait or the driver call fails; the table then
//    still lists what could not be freed.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "sdalloc/core/virtual_memory.hpp"

namespace sdalloc::cuda {

// What unmap waits for before it removes a mapping.
enum class UnmapWait {
  kDevice,  // cudaDeviceSynchronize on the owning device: all its streams
  kStream,  // cudaStreamSynchronize(last_use) only
};

struct CudaVirtualMemoryOptions {
  std::vector<int> peer_devices;  // also get read/write access to every mapping
  UnmapWait unmap_wait = UnmapWait::kDevice;
};

class DriverVirtualMemory;

class CudaVirtualMemory final : public VirtualMemory {
 public:
  explicit CudaVirtualMemory(int device = 0, CudaVirtualMemoryOptions options = {});
  ~CudaVirtualMemory() override;

  std::size_t granularity() const override;
  void* reserve(std::size_t bytes, std::size_t alignment = 0) override;
  void release(void* base, std::size_t bytes) override;
  PhysicalChunk create(std::size_t bytes) override;
  void destroy(PhysicalChunk chunk) override;
  void map(void* address, PhysicalChunk chunk) override;
  void unmap(void* address, std::size_t bytes, Stream last_use) override;
  std::size_t physical_capacity() const override;
  std::string name() const override;  // "cuda-vm(device <n>)"

  int device() const { return device_; }
  const CudaVirtualMemoryOptions& options() const { return options_; }
  // What exists now: bytes of chunks created and not destroyed, bytes mapped, bytes of
  // address space reserved.
  std::size_t physical_bytes() const;
  std::size_t mapped_bytes() const;
  std::size_t reserved_bytes() const;

 private:
  int device_;
  CudaVirtualMemoryOptions options_;
  std::unique_ptr<DriverVirtualMemory> impl_;
};

}  // namespace sdalloc::cuda
