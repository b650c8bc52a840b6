// sdalloc/transfer/copy_backend.hpp - what moves bytes: the copy backend interface.
//
// The TransferEngine decides what to copy and how to pack it; a CopyBackend carries the
// copies out. One *copy call* is one submission to the device API: a list of regions moved
// together on one of the backend's copy streams (cudaMemcpyBatchAsync, or one
// cudaMemcpyAsync when the list has one region). Calls on one copy stream run in the order
// submitted; calls on different copy streams may overlap. calls() counts submissions, which
// is what batching reduces.
//
// Two backends: HostCopyBackend (host_copy_backend.hpp: worker threads memcpy between two
// host pools, the second standing for the device) and cuda::CudaCopyBackend
// (sdalloc/cuda/cuda_copy_backend.hpp, in libsdalloc_cuda).
//
// Contract:
//  - submit() returns at once; `done` is called exactly once per call, from any thread,
//    with nullptr when every region landed or the reason it failed. After `done` the source
//    may be reused and the destination read.
//  - pinned_host(): where the engine takes its staging memory (page-locked on a device).
//  - register_host()/unregister_host(): page-lock memory the user already has, in place.
//  - map_host(): host memory the device addresses directly (for data read once).
//  - stream_wait(fence, s): work queued on compute stream s after this call runs after the
//    call behind `fence` completed (CUDA: cudaStreamWaitEvent; host: blocks until done).
//  - Thread-safe: any thread may submit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "sdalloc/core/resource.hpp"
#include "sdalloc/core/stream.hpp"

namespace sdalloc {

enum class CopyKind : std::uint8_t { kHostToDevice, kDeviceToHost, kDeviceToDevice };
const char* to_string(CopyKind kind);

struct CopyRegion {
  void* dst = nullptr;
  const void* src = nullptr;
  std::size_t bytes = 0;
};

struct CopyCall {
  CopyKind kind = CopyKind::kHostToDevice;
  std::vector<CopyRegion> regions;
  std::function<void(std::exception_ptr)> done;  // exactly once
};

// Host memory both sides can address: the host pointer and the device's pointer to it.
struct MappedBuffer {
  void* host = nullptr;
  void* device = nullptr;
  std::size_t bytes = 0;
};

// The backend's record of one submitted call, for stream_wait (opaque to the engine).
class CopyFence {
 public:
  virtual ~CopyFence() = default;
  virtual bool completed() const = 0;
};

class CopyBackend {
 public:
  CopyBackend() = default;
  CopyBackend(const CopyBackend&) = delete;
  CopyBackend& operator=(const CopyBackend&) = delete;
  virtual ~CopyBackend() = default;

  virtual std::string name() const = 0;
  virtual std::size_t copy_streams() const = 0;
  virtual std::shared_ptr<CopyFence> submit(CopyCall call, std::size_t copy_stream) = 0;
  // Blocks until every call submitted so far has called its `done`.
  virtual void synchronize() = 0;
  virtual void stream_wait(const CopyFence& fence, Stream compute_stream) = 0;

  virtual MemoryResource& pinned_host() = 0;
  virtual void register_host(void* ptr, std::size_t bytes) = 0;
  virtual void unregister_host(void* ptr) = 0;
  virtual MappedBuffer map_host(std::size_t bytes) = 0;
  virtual void unmap_host(const MappedBuffer& buffer) = 0;

  // Copy calls submitted so far (device API submissions).
  virtual std::uint64_t calls() const = 0;
  // The Stream token of a copy stream, for stream-ordered pools (its cudaStream_t on CUDA).
  virtual Stream stream_token(std::size_t copy_stream) const = 0;
};

}  // namespace sdalloc
