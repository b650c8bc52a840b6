// sdalloc/cuda/cuda_copy_backend.hpp - the TransferEngine's copy backend on a CUDA device.
//
// Each copy stream is a non-blocking cudaStream_t of its own, so the engine's copies overlap
// the caller's compute and each other (host->device on one, device->host on the other). A
// copy call of one region is one cudaMemcpyAsync; of several, one cudaMemcpyBatchAsync
// (CUDA >= 12.8; with an older runtime one cudaMemcpyAsync per region, each counted as a
// call). After the copy an event is recorded; one completion thread per copy stream waits
// on the events in order and calls each call's `done`, so the engine frees staging memory
// and ends requests without the caller polling. stream_wait() is cudaStreamWaitEvent on
// that event.
//
// Pinned memory: pinned_host() is a PinnedHostResource (cudaHostAlloc); register_host() is
// cudaHostRegister in place (PinnedHostRegistration) until unregister_host(); map_host() is
// cudaHostAlloc(cudaHostAllocMapped) with the device's pointer to it
// (cudaHostGetDevicePointer), for data the device reads once.
//
// Errors: the constructor throws CudaError without a usable driver or device; a copy the
// runtime refuses fails its call (done gets a TransferError naming the CUDA error), and the
// engine goes on. Thread-safe.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "sdalloc/cuda/pinned_host_resource.hpp"
#include "sdalloc/transfer/copy_backend.hpp"

namespace sdalloc::cuda {

struct CudaCopyBackendOptions {
  int device = 0;
  std::size_t copy_streams = 2;
  bool batch_api = true;  // cudaMemcpyBatchAsync for calls of several regions, when present
};

class CudaCopyBackend final : public CopyBackend {
 public:
  explicit CudaCopyBackend(CudaCopyBackendOptions options = {});
  ~CudaCopyBackend() override;

  std::string name() const override;  // "cuda_copy(device N)"
  std::size_t copy_streams() const override { return lanes_.size(); }
  std::shared_ptr<CopyFence> submit(CopyCall call, std::size_t copy_stream) override;
  void synchronize() override;
  void stream_wait(const CopyFence& fence, Stream compute_stream) override;

  MemoryResource& pinned_host() override { return pinned_; }
  void register_host(void* ptr, std::size_t bytes) override;
  void unregister_host(void* ptr) override;
  MappedBuffer map_host(std::size_t bytes) override;
  void unmap_host(const MappedBuffer& buffer) override;

  std::uint64_t calls() const override;
  Stream stream_token(std::size_t copy_stream) const override {
    return Stream(reinterpret_cast<std::uintptr_t>(native_stream(copy_stream)));
  }
  // The cudaStream_t of a copy stream, as void* (callers need no CUDA header).
  void* native_stream(std::size_t copy_stream) const;

 private:
  struct Fence;
  struct Pending {
    std::shared_ptr<Fence> fence;
    CopyCall call;
  };
  struct Lane {
    void* stream = nullptr;
    std::deque<Pending> pending;
    std::thread completer;
  };
  void complete(std::size_t lane);

  CudaCopyBackendOptions options_;
  PinnedHostResource pinned_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable idle_;
  std::vector<std::unique_ptr<Lane>> lanes_;
  std::size_t outstanding_ = 0;
  bool stopping_ = false;
  std::uint64_t calls_ = 0;
  std::map<void*, PinnedHostRegistration> registrations_;
};

}  // namespace sdalloc::cuda
