// sdalloc/cuda/cuda_stream_device.hpp - the unit offloader's StreamDevice on a CUDA device.
//
// The compute queue is the caller's stream (torch's current stream when offload() was
// called); the copy queue a non-blocking stream of its own, so copies never serialise with
// the legacy default stream. Events are cudaEvent_t (timing ones only where asked:
// cudaEventDisableTiming otherwise); record is cudaEventRecord, wait cudaStreamWaitEvent,
// a copy one cudaMemcpyAsync host->device on the copy stream. Device memory is cudaMalloc
// (a CudaResource: the offloader takes one region, once). register_host is
// cudaHostRegister in place: any failure (a cgroup's limit, no memory, an address already
// registered) is RegistrationRefused naming CUDA's error, which the offloader answers with
// its staging fallback. hold(q) queues a host function (cudaLaunchHostFunc) that waits for
// open() for at most kHoldTimeoutSeconds. host_seconds is the steady clock.
//
// Errors: the constructor throws CudaError without a usable driver or device; any other
// failing call throws CudaError naming it. Thread-safe.
#pragma once

#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "sdalloc/cuda/cuda_resource.hpp"
#include "sdalloc/transfer/stream_device.hpp"

namespace sdalloc::cuda {

struct CudaStreamDeviceOptions {
  int device = 0;
  void* compute_stream = nullptr;  // a cudaStream_t; nullptr: the legacy default stream
};

class CudaStreamDevice final : public StreamDevice {
 public:
  explicit CudaStreamDevice(CudaStreamDeviceOptions options);
  ~CudaStreamDevice() override;  // synchronizes both streams, destroys events and its stream

  std::string name() const override;  // "cuda_stream_device(device N)"
  MemoryResource& device_memory() override { return memory_; }
  Stream compute_stream() const override;

  Event create_event(bool timing) override;
  void record(Event event, DeviceQueue queue) override;
  void wait(DeviceQueue queue, Event event) override;
  void copy_to_device(void* dst, const void* src, std::size_t bytes) override;
  void synchronize(DeviceQueue queue) override;
  void wait_host(Event event) override;
  double elapsed_seconds(Event from, Event to) override;
  Hold hold(DeviceQueue queue) override;
  void open(Hold hold) override;
  double host_seconds() override;

  void register_host(void* ptr, std::size_t bytes) override;
  void unregister_host(void* ptr, std::size_t bytes) override;
  void* allocate_pinned(std::size_t bytes) override;
  void free_pinned(void* ptr, std::size_t bytes) override;

 private:
  struct Gate;
  void* stream_of(DeviceQueue queue) const;
  void* event_at(Event event) const;

  CudaStreamDeviceOptions options_;
  CudaResource memory_;
  void* copy_stream_ = nullptr;
  mutable std::mutex mutex_;
  std::vector<void*> events_;  // cudaEvent_t
  std::deque<std::unique_ptr<Gate>> gates_;
};

}  // namespace sdalloc::cuda
