// cuda_stream_device.cpp - streams, events, cudaMemcpyAsync, cudaHostRegister, host holds.
#include "sdalloc/cuda/cuda_stream_device.hpp"

#include <cuda_runtime_api.h>

#include <chrono>
#include <condition_variable>

#include "cuda_call.hpp"
#include "sdalloc/core/errors.hpp"

namespace sdalloc::cuda {

// A point of a stream that waits for the host (the recorded step's timing).
struct CudaStreamDevice::Gate {
  std::mutex mutex;
  std::condition_variable opened;
  bool open = false;
};

CudaStreamDevice::CudaStreamDevice(CudaStreamDeviceOptions options)
    : options_(options), memory_(options.device) {
  const detail::DeviceGuard guard(options_.device, name());
  cudaStream_t stream = nullptr;
  detail::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), name(),
                "cudaStreamCreateWithFlags");
  copy_stream_ = stream;
}

CudaStreamDevice::~CudaStreamDevice() {
  {
    const std::lock_guard lock(mutex_);
    for (auto& gate : gates_) {  // nothing may stay held
      const std::lock_guard g(gate->mutex);
      gate->open = true;
      gate->opened.notify_all();
    }
  }
  (void)cudaStreamSynchronize(static_cast<cudaStream_t>(copy_stream_));
  (void)cudaStreamSynchronize(static_cast<cudaStream_t>(options_.compute_stream));
  for (void* e : events_) (void)cudaEventDestroy(static_cast<cudaEvent_t>(e));
  (void)cudaStreamDestroy(static_cast<cudaStream_t>(copy_stream_));
}

std::string CudaStreamDevice::name() const {
  return "cuda_stream_device(device " + std::to_string(options_.device) + ")";
}

Stream CudaStreamDevice::compute_stream() const {
  return Stream::from_native(options_.compute_stream);
}

void* CudaStreamDevice::stream_of(DeviceQueue queue) const {
  return queue == DeviceQueue::kCompute ? options_.compute_stream : copy_stream_;
}

void* CudaStreamDevice::event_at(Event event) const {
  const std::lock_guard lock(mutex_);
  if (event >= events_.size()) throw InvalidArgument(name() + ": no such event");
  return events_[event];
}

StreamDevice::Event CudaStreamDevice::create_event(bool timing) {
  const detail::DeviceGuard guard(options_.device, name());
  cudaEvent_t e = nullptr;
  detail::check(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming),
                name(), "cudaEventCreateWithFlags");
  const std::lock_guard lock(mutex_);
  events_.push_back(e);
  return events_.size() - 1;
}

void CudaStreamDevice::record(Event event, DeviceQueue queue) {
  const detail::DeviceGuard guard(options_.device, name());
  detail::check(cudaEventRecord(static_cast<cudaEvent_t>(event_at(event)),
                                static_cast<cudaStream_t>(stream_of(queue))),
                name(), "cudaEventRecord");
}

void CudaStreamDevice::wait(DeviceQueue queue, Event event) {
  const detail::DeviceGuard guard(options_.device, name());
  detail::check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream_of(queue)),
                                    static_cast<cudaEvent_t>(event_at(event)), 0),
                name(), "cudaStreamWaitEvent");
}

void CudaStreamDevice::copy_to_device(void* dst, const void* src, std::size_t bytes) {
  const detail::DeviceGuard guard(options_.device, name());
  detail::check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice,
                                static_cast<cudaStream_t>(copy_stream_)),
                name(), "cudaMemcpyAsync");
}

void CudaStreamDevice::synchronize(DeviceQueue queue) {
  detail::check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_of(queue))), name(),
                "cudaStreamSynchronize");
}

void CudaStreamDevice::wait_host(Event event) {
  detail::check(cudaEventSynchronize(static_cast<cudaEvent_t>(event_at(event))), name(),
                "cudaEventSynchronize");
}

double CudaStreamDevice::elapsed_seconds(Event from, Event to) {
  float ms = 0;
  detail::check(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(event_at(from)),
                                     static_cast<cudaEvent_t>(event_at(to))),
                name(), "cudaEventElapsedTime");
  return static_cast<double>(ms) / 1e3;
}

StreamDevice::Hold CudaStreamDevice::hold(DeviceQueue queue) {
  Gate* gate = nullptr;
  Hold id = 0;
  {
    const std::lock_guard lock(mutex_);
    gates_.push_back(std::make_unique<Gate>());
    gate = gates_.back().get();
    id = gates_.size() - 1;
  }
  // The host function waits for open(), at most kHoldTimeoutSeconds: a unit whose forward
  // waits for its own kernels (a .item()) then costs that much once, and never deadlocks.
  const auto wait = [](void* data) {
    auto* g = static_cast<Gate*>(data);
    std::unique_lock lock(g->mutex);
    g->opened.wait_for(lock, std::chrono::duration<double>(kHoldTimeoutSeconds),
                       [&] { return g->open; });
  };
  detail::check(cudaLaunchHostFunc(static_cast<cudaStream_t>(stream_of(queue)), wait, gate), name(),
                "cudaLaunchHostFunc");
  return id;
}

void CudaStreamDevice::open(Hold hold) {
  Gate* gate = nullptr;
  {
    const std::lock_guard lock(mutex_);
    if (hold >= gates_.size()) throw InvalidArgument(name() + ": no such hold");
    gate = gates_[hold].get();
  }
  const std::lock_guard g(gate->mutex);
  gate->open = true;
  gate->opened.notify_all();
}

double CudaStreamDevice::host_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void CudaStreamDevice::register_host(void* ptr, std::size_t bytes) {
  if (ptr == nullptr || bytes == 0) {
    throw InvalidArgument(name() + ": cannot register an empty range or a null pointer");
  }
  const detail::DeviceGuard guard(options_.device, name());
  const cudaError_t rc = cudaHostRegister(ptr, bytes, cudaHostRegisterPortable);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    throw RegistrationRefused(name() + ": cudaHostRegister of " + format_bytes(bytes) +
                              " refused: " + detail::describe(rc));
  }
}

void CudaStreamDevice::unregister_host(void* ptr, std::size_t /*bytes*/) {
  const cudaError_t rc = cudaHostUnregister(ptr);
  if (rc != cudaSuccess && !detail::is_shutdown(rc)) {
    detail::throw_error(name(), "cudaHostUnregister", rc);
  }
}

void* CudaStreamDevice::allocate_pinned(std::size_t bytes) {
  const detail::DeviceGuard guard(options_.device, name());
  void* p = nullptr;
  const cudaError_t rc = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    throw RegistrationRefused(name() + ": cudaHostAlloc of " + format_bytes(bytes) +
                              " refused: " + detail::describe(rc));
  }
  return p;
}

void CudaStreamDevice::free_pinned(void* ptr, std::size_t /*bytes*/) {
  const cudaError_t rc = cudaFreeHost(ptr);
  if (rc != cudaSuccess && !detail::is_shutdown(rc))
    detail::throw_error(name(), "cudaFreeHost", rc);
}

}  // namespace sdalloc::cuda
