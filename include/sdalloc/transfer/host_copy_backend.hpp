// sdalloc/transfer/host_copy_backend.hpp - the copy backend without a device.
//
// HostCopyBackend runs each copy stream as one worker thread that memcpy's a call's regions
// in submission order; "device" memory is simply host memory from a second pool (the
// caller's), so the whole TransferEngine and the weight offloader run, and are tested, on a
// machine without a GPU. Pinned memory is ordinary host memory (HostResource) and
// registration only books the range.
//
// A known copy speed: with `bytes_per_second` > 0 a call lasts at least bytes / speed (the
// worker sleeps out the rest after its memcpy), like a DMA engine of that bandwidth; this is
// what makes overlap measurable with simulated compute of known duration. 0: as fast as
// memcpy.
//
// Failures: `fail_call`, when set, is asked before each call runs; answering true makes the
// call fail (its `done` gets a TransferError) the way a device copy can fail, so the
// engine's error paths are exercised without a device. Thread-safe.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "sdalloc/resources/host_resource.hpp"
#include "sdalloc/transfer/copy_backend.hpp"

namespace sdalloc {

struct HostCopyBackendOptions {
  std::size_t copy_streams = 2;  // one worker thread each
  double bytes_per_second = 0;   // 0: unthrottled
  std::function<bool(const CopyCall&)> fail_call;
};

class HostCopyBackend final : public CopyBackend {
 public:
  explicit HostCopyBackend(HostCopyBackendOptions options = {});
  ~HostCopyBackend() override;

  std::string name() const override;  // "host_copy"
  std::size_t copy_streams() const override { return workers_.size(); }
  std::shared_ptr<CopyFence> submit(CopyCall call, std::size_t copy_stream) override;
  void synchronize() override;
  void stream_wait(const CopyFence& fence, Stream compute_stream) override;

  MemoryResource& pinned_host() override { return pinned_; }
  void register_host(void* ptr, std::size_t bytes) override;
  void unregister_host(void* ptr) override;
  MappedBuffer map_host(std::size_t bytes) override;
  void unmap_host(const MappedBuffer& buffer) override;

  std::uint64_t calls() const override;
  // Tokens 1 + i (0 is the default stream, the host compute's).
  Stream stream_token(std::size_t copy_stream) const override {
    return Stream(1 + copy_stream % workers_.size());
  }
  std::uint64_t bytes_copied() const;
  std::uint64_t registered_bytes() const;

 private:
  struct Fence;
  struct Job {
    CopyCall call;
    std::shared_ptr<Fence> fence;
  };
  struct Worker {
    std::deque<Job> jobs;
    std::thread thread;
  };
  void run(std::size_t index);

  HostCopyBackendOptions options_;
  HostResource pinned_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable idle_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::size_t outstanding_ = 0;
  bool stopping_ = false;
  std::uint64_t calls_ = 0;
  std::uint64_t bytes_ = 0;
  std::uint64_t registered_ = 0;
  std::vector<std::pair<void*, std::size_t>> registrations_;
};

}  // namespace sdalloc
