// sdalloc/cuda/pinned_host_resource.hpp - page-locked host memory for fast, async copies.
//
// PinnedHostResource hands out host memory that the CUDA driver has page-locked
// (cudaHostAlloc), so cudaMemcpyAsync to and from it runs as DMA without a staging copy and
// without blocking the host. Pinned memory is scarce (it cannot be swapped) and slow to
// allocate: put a CachingPool on top of this resource, never allocate tensors from it
// directly. Memory is portable (usable from every device's context) by default.
//
// PinnedHostRegistration page-locks memory that already exists (cudaHostRegister), for
// example a memory-mapped weights file, for as long as the registration object lives
// (cudaHostUnregister in its destructor).
//
// Streams: host memory needs no stream order of its own; a deallocate(ptr, bytes, s) frees
// with cudaFreeHost, which waits for all work of the device that may still copy from it.
// Alignment: page-aligned (4 KiB) results. Thread-safe.
//
// Errors:
//  - constructors: CudaError when there is no usable driver or device.
//  - allocate: OutOfMemory when cudaHostAlloc reports cudaErrorMemoryAllocation, CudaError
//    for other failures.
//  - PinnedHostRegistration: InvalidArgument for a null pointer or zero bytes, or memory
//    already registered (cudaErrorHostMemoryAlreadyRegistered); CudaError otherwise.
#pragma once

#include <cstddef>
#include <string>

#include "sdalloc/core/resource.hpp"

namespace sdalloc::cuda {

struct PinnedHostResourceOptions {
  bool portable = true;         // cudaHostAllocPortable: pinned for every CUDA context
  bool mapped = false;          // cudaHostAllocMapped: also addressable from the device
  bool write_combined = false;  // cudaHostAllocWriteCombined: fast host->device, slow reads
};

class PinnedHostResource final : public MemoryResource {
 public:
  explicit PinnedHostResource(PinnedHostResourceOptions options = {});

  const PinnedHostResourceOptions& options() const { return options_; }
  std::string name() const override;  // "pinned_host"

 private:
  void* do_allocate(std::size_t bytes, Stream stream) override;
  void do_deallocate(void* ptr, std::size_t bytes, Stream stream) override;

  PinnedHostResourceOptions options_;
};

// Page-locks [ptr, ptr + bytes) while it lives. Move-only. The memory must outlive it.
class PinnedHostRegistration {
 public:
  struct Options {
    bool portable = true;    // cudaHostRegisterPortable
    bool mapped = false;     // cudaHostRegisterMapped
    bool read_only = false;  // cudaHostRegisterReadOnly: the device only reads it
  };

  PinnedHostRegistration(void* ptr, std::size_t bytes);
  PinnedHostRegistration(void* ptr, std::size_t bytes, Options options);
  PinnedHostRegistration(PinnedHostRegistration&& other) noexcept;
  PinnedHostRegistration& operator=(PinnedHostRegistration&& other) noexcept;
  PinnedHostRegistration(const PinnedHostRegistration&) = delete;
  PinnedHostRegistration& operator=(const PinnedHostRegistration&) = delete;
  ~PinnedHostRegistration();

  void* data() const { return ptr_; }
  std::size_t size() const { return bytes_; }

 private:
  void unregister() noexcept;

  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace sdalloc::cuda
