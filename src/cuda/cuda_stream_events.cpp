// cuda_stream_events.cpp - the CUDA event backend and the public CudaStreamEvents.
#include "sdalloc/cuda/cuda_stream_events.hpp"

#include <cuda_runtime_api.h>

#include <string>

#include "cuda_call.hpp"
#include "pooled_stream_events.hpp"

namespace sdalloc::cuda {

namespace {

cudaEvent_t native(EventBackend::Handle event) { return reinterpret_cast<cudaEvent_t>(event); }

// cudaEvent_t objects of one device, made without timing (cheaper to record and query).
class CudaEventBackend final : public EventBackend {
 public:
  explicit CudaEventBackend(int device)
      : device_(device), who_("stream events(" + std::to_string(device) + ")") {}

  Handle create() override {
    const detail::DeviceGuard guard(device_, who_);
    cudaEvent_t event = nullptr;
    detail::check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), who_,
                  "cudaEventCreateWithFlags");
    return reinterpret_cast<Handle>(event);
  }

  void destroy(Handle event) noexcept override {
    if (cudaEventDestroy(native(event)) != cudaSuccess) (void)cudaGetLastError();
  }

  // record and stream_idle make the device current: the default stream (0) is the current
  // device's, so with two GPUs it would otherwise resolve on whichever device the calling
  // thread has current. query and synchronize name an event, which knows its device.
  void record(Handle event, Stream stream) override {
    const detail::DeviceGuard guard(device_, who_);
    const cudaError_t rc = cudaEventRecord(native(event), stream.as_native<CUstream_st>());
    // At exit the runtime is gone and no work runs any more: nothing to wait for.
    if (detail::is_shutdown(rc)) {
      (void)cudaGetLastError();
      return;
    }
    detail::check(rc, who_, "cudaEventRecord");
  }

  bool query(Handle event) override {
    return answer(cudaEventQuery(native(event)), "cudaEventQuery");
  }

  void synchronize(Handle event) override {
    detail::check(cudaEventSynchronize(native(event)), who_, "cudaEventSynchronize");
  }

  bool stream_idle(Stream stream) override {
    const detail::DeviceGuard guard(device_, who_);
    return answer(cudaStreamQuery(stream.as_native<CUstream_st>()), "cudaStreamQuery");
  }

 private:
  // cudaSuccess: done; cudaErrorNotReady: still running (an answer, cleared so that it
  // never shows in someone's cudaGetLastError); anything else is an error.
  // A runtime torn down at exit runs nothing any more: done too.
  bool answer(cudaError_t rc, const char* call) const {
    if (rc == cudaSuccess) return true;
    if (detail::is_shutdown(rc)) {
      (void)cudaGetLastError();
      return true;
    }
    if (rc == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    detail::throw_error(who_, call, rc);
  }

  int device_;
  std::string who_;
};

}  // namespace

CudaStreamEvents::CudaStreamEvents(int device) : device_(device) {
  detail::require_device(device, "stream events(" + std::to_string(device) + ")");
  events_ = std::make_unique<PooledStreamEvents>(std::make_unique<CudaEventBackend>(device));
}

CudaStreamEvents::~CudaStreamEvents() = default;

StreamEvents::Event CudaStreamEvents::record(Stream stream) { return events_->record(stream); }
bool CudaStreamEvents::query(Event event) { return events_->query(event); }
void CudaStreamEvents::synchronize(Event event) { events_->synchronize(event); }
void CudaStreamEvents::release(Event event) { events_->release(event); }
bool CudaStreamEvents::idle(Stream stream) { return events_->idle(stream); }
std::size_t CudaStreamEvents::events_created() const { return events_->events_created(); }
std::size_t CudaStreamEvents::events_pooled() const { return events_->events_pooled(); }

}  // namespace sdalloc::cuda
