// sdalloc/cuda/cuda_async_resource.hpp - stream-ordered device memory from cudaMallocAsync.
//
// CudaAsyncResource creates its own CUDA memory pool (cudaMemPoolCreate) on one device and
// serves every request from it with cudaMallocFromPoolAsync / cudaFreeAsync. It never uses
// the device's default pool, so other libraries' settings (e.g. PyTorch's) do not change it
// and its trimming does not touch theirs.
//
// Release threshold: the driver returns a pool's cached memory to the device whenever a
// stream, event or device is synchronized and the pool holds more than its release
// threshold. The CUDA default (0) returns everything at every synchronize, so each
// iteration of a loop would map its memory again. This resource sets the threshold to
// options.release_threshold, by default all memory (the pool keeps what it has, like a
// caching allocator); trim() returns the cache explicitly.
//
// Streams: allocate(bytes, s) is ordered on s (the memory is usable by work on s at once,
// by other streams after they synchronize with s); deallocate(ptr, bytes, s) frees in s's
// order: the memory may be handed out again to later work on s at once, and to other
// streams once the free has been reached. This is exactly the MemoryResource contract.
// Device: each call makes `device` current for its duration and restores it afterwards.
// Alignment: at least 256 bytes. Thread-safe (the CUDA runtime is).
//
// Errors:
//  - constructor: CudaError when there is no usable driver or device, or the device does not
//    support memory pools (cudaDevAttrMemoryPoolsSupported); InvalidArgument for a device
//    out of range. Nothing is left allocated when it throws.
//  - allocate: OutOfMemory for cudaErrorMemoryAllocation (error cleared), CudaError else.
//  - deallocate: CudaError when cudaFreeAsync fails; ignored after runtime shutdown.
// Destruction destroys the pool; memory still allocated from it stays valid until freed
// (the driver releases the pool then), but should not outlive the resource by design.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include "sdalloc/core/resource.hpp"

namespace sdalloc::cuda {

struct CudaAsyncResourceOptions {
  // Bytes the pool may keep cached across a synchronize (cudaMemPoolAttrReleaseThreshold).
  // The default keeps everything; 0 is CUDA's own default (trim at every synchronize).
  std::uint64_t release_threshold = std::numeric_limits<std::uint64_t>::max();
  // Bytes allocated and freed once at construction, so the pool starts with this much
  // reserved (0: start empty). Must not exceed the release threshold to stay cached.
  std::size_t initial_pool_size = 0;
};

class CudaAsyncResource final : public MemoryResource {
 public:
  explicit CudaAsyncResource(int device = 0, CudaAsyncResourceOptions options = {});
  ~CudaAsyncResource() override;

  int device() const { return device_; }
  const CudaAsyncResourceOptions& options() const { return options_; }
  std::size_t capacity() const override { return capacity_; }
  std::string name() const override;  // "cuda_async(<device>)"

  // Returns cached memory to the device until the pool holds at most `keep_bytes` beyond
  // its live allocations (cudaMemPoolTrimTo). Throws CudaError.
  void trim(std::size_t keep_bytes = 0);
  // Bytes the pool holds from the device now: live plus cached
  // (cudaMemPoolAttrReservedMemCurrent). Throws CudaError.
  std::size_t reserved_bytes() const;
  // The cudaMemPool_t, for code that wants to set more attributes (e.g. peer access).
  void* native_pool() const { return pool_; }

 private:
  void* do_allocate(std::size_t bytes, Stream stream) override;
  void do_deallocate(void* ptr, std::size_t bytes, Stream stream) override;

  int device_;
  std::string name_;  // made once: every call's errors name the resource
  CudaAsyncResourceOptions options_;
  std::size_t capacity_ = 0;
  void* pool_ = nullptr;  // cudaMemPool_t
};

}  // namespace sdalloc::cuda
