// sdalloc/transfer/stream_device.hpp - a device as the offloader sees it: two queues
// (compute and copy), events, host->device copies, page-locking, one memory resource.
//
// The unit offloader (unit_offloader.hpp) orders everything it does with streams and
// events only, as CUDA does: work queued on a queue runs in order; record(e, q) marks the
// point q has reached; wait(q, e) makes work queued on q afterwards run after the work
// before e's latest record (a wait on an event never recorded waits for nothing). The host
// never blocks on either queue in the offloader's steady state; synchronize() and
// wait_host() are for set-up, plans and the documented fallbacks.
//
// Two devices:
//  - SimulatedDevice (simulated_device.hpp): the host backend - a compute queue of
//    simulated kernels, one copy engine at a given bandwidth and cost per call, a cost per
//    API call on the host, page-locking with mlock; everything here is tested on it.
//  - cuda::CudaStreamDevice (sdalloc/cuda/cuda_stream_device.hpp): the caller's CUDA
//    stream as the compute queue, a non-blocking copy stream, cudaEvent_t, cudaMemcpyAsync,
//    cudaHostRegister, cudaMalloc.
//
// Contract:
//  - copy_to_device(dst, src, n) queues one copy call on the copy queue. `src` must be
//    page-locked (register_host, allocate_pinned): a device copies pageable memory only
//    through a blocking staged copy, which the offloader never asks for.
//  - register_host throws RegistrationRefused when the operating system refuses to lock
//    the pages (RLIMIT_MEMLOCK, a cgroup's limit, no memory); nothing is locked then.
//  - Events are made once (create_event) and live as long as the device.
//  - elapsed_seconds(a, b): between the latest records of two timing events, both done.
//  - hold(q) stops q at this point until open() (CUDA: a host function on the stream that
//    waits for the flag, for at most hold_timeout seconds, so a unit that waits for its own
//    kernels cannot deadlock). The recorded step holds the compute queue while the host
//    launches a unit, so that events then time the device alone.
//  - Thread-safe: any thread may call anything.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/core/resource.hpp"
#include "sdalloc/core/stream.hpp"

namespace sdalloc {

class RegistrationRefused : public Error {
 public:
  using Error::Error;
};

enum class DeviceQueue : std::uint8_t { kCompute, kCopy };

class StreamDevice {
 public:
  using Event = std::size_t;
  using Hold = std::size_t;
  static constexpr double kHoldTimeoutSeconds = 0.2;

  StreamDevice() = default;
  StreamDevice(const StreamDevice&) = delete;
  StreamDevice& operator=(const StreamDevice&) = delete;
  virtual ~StreamDevice() = default;

  virtual std::string name() const = 0;
  // Where device memory comes from (the offloader takes one region from it, once).
  virtual MemoryResource& device_memory() = 0;
  // The compute queue's token: a forward is checked against it (its cudaStream_t on CUDA).
  virtual Stream compute_stream() const = 0;

  virtual Event create_event(bool timing) = 0;
  virtual void record(Event event, DeviceQueue queue) = 0;
  virtual void wait(DeviceQueue queue, Event event) = 0;
  virtual void copy_to_device(void* dst, const void* src, std::size_t bytes) = 0;
  // The host waits for everything queued on `queue` so far; for the latest record of `event`.
  virtual void synchronize(DeviceQueue queue) = 0;
  virtual void wait_host(Event event) = 0;
  virtual double elapsed_seconds(Event from, Event to) = 0;
  virtual Hold hold(DeviceQueue queue) = 0;
  virtual void open(Hold hold) = 0;
  // The calling thread's clock, in seconds, on the device's time base (a steady clock; the
  // simulated device's simulated time).
  virtual double host_seconds() = 0;

  virtual void register_host(void* ptr, std::size_t bytes) = 0;
  virtual void unregister_host(void* ptr, std::size_t bytes) = 0;
  // Page-locked host memory of its own (the fallback's staging buffers).
  virtual void* allocate_pinned(std::size_t bytes) = 0;
  virtual void free_pinned(void* ptr, std::size_t bytes) = 0;
};

}  // namespace sdalloc
