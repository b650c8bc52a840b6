// cuda_copy_backend.cpp - copy streams, cudaMemcpy(Batch)Async, events, completion threads.
#include "sdalloc/cuda/cuda_copy_backend.hpp"

#include <cuda_runtime_api.h>

#include <atomic>
#include <string>

#include "cuda_call.hpp"
#include "sdalloc/core/errors.hpp"
#include "sdalloc/transfer/transfer_handle.hpp"

namespace sdalloc::cuda {

struct CudaCopyBackend::Fence final : CopyFence {
  cudaEvent_t event = nullptr;
  std::atomic<bool> done{false};
  bool completed() const override { return done.load(std::memory_order_acquire); }
  ~Fence() override {
    if (event != nullptr) (void)cudaEventDestroy(event);
  }
};

namespace {

cudaMemcpyKind kind_of(CopyKind kind) {
  switch (kind) {
    case CopyKind::kHostToDevice:
      return cudaMemcpyHostToDevice;
    case CopyKind::kDeviceToHost:
      return cudaMemcpyDeviceToHost;
    case CopyKind::kDeviceToDevice:
      return cudaMemcpyDeviceToDevice;
  }
  return cudaMemcpyDefault;
}

// One submission of the call's regions on `stream`; answers the runtime's status.
cudaError_t copy_regions(const CopyCall& call, cudaStream_t stream, bool batch_api,
                         std::uint64_t& calls) {
  if (call.regions.size() == 1 || !batch_api) {
    for (const CopyRegion& r : call.regions) {
      ++calls;
      const cudaError_t rc = cudaMemcpyAsync(r.dst, r.src, r.bytes, kind_of(call.kind), stream);
      if (rc != cudaSuccess) return rc;
    }
    return cudaSuccess;
  }
#if CUDART_VERSION >= 12080
  std::vector<void*> dsts;
  std::vector<const void*> srcs;
  std::vector<std::size_t> sizes;
  dsts.reserve(call.regions.size());
  srcs.reserve(call.regions.size());
  sizes.reserve(call.regions.size());
  for (const CopyRegion& r : call.regions) {
    dsts.push_back(r.dst);
    srcs.push_back(r.src);
    sizes.push_back(r.bytes);
  }
  cudaMemcpyAttributes attributes{};
  attributes.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  attributes.flags = cudaMemcpyFlagPreferOverlapWithCompute;
  std::size_t first = 0;
  ++calls;
#if CUDART_VERSION >= 13000
  return cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), sizes.size(), &attributes,
                              &first, 1, stream);
#else
  std::size_t failed = 0;
  return cudaMemcpyBatchAsync(dsts.data(), const_cast<void**>(srcs.data()), sizes.data(),
                              sizes.size(), &attributes, &first, 1, &failed, stream);
#endif
#else
  return copy_regions(call, stream, false, calls);
#endif
}

}  // namespace

CudaCopyBackend::CudaCopyBackend(CudaCopyBackendOptions options)
    : options_(options), pinned_(PinnedHostResourceOptions{}) {
  detail::require_device(options_.device, name());
  if (options_.copy_streams == 0) {
    throw InvalidArgument(name() + ": copy_streams is 0; need at least one copy stream");
  }
  const detail::DeviceGuard guard(options_.device, name());
  for (std::size_t i = 0; i < options_.copy_streams; ++i) {
    auto lane = std::make_unique<Lane>();
    cudaStream_t stream = nullptr;
    detail::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), name(),
                  "cudaStreamCreateWithFlags");
    lane->stream = stream;
    lanes_.push_back(std::move(lane));
  }
  for (std::size_t i = 0; i < lanes_.size(); ++i) {
    lanes_[i]->completer = std::thread([this, i] { complete(i); });
  }
}

CudaCopyBackend::~CudaCopyBackend() {
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& lane : lanes_) lane->completer.join();
  for (auto& lane : lanes_) (void)cudaStreamDestroy(static_cast<cudaStream_t>(lane->stream));
}

std::string CudaCopyBackend::name() const {
  return "cuda_copy(device " + std::to_string(options_.device) + ")";
}

void* CudaCopyBackend::native_stream(std::size_t copy_stream) const {
  return lanes_[copy_stream % lanes_.size()]->stream;
}

std::shared_ptr<CopyFence> CudaCopyBackend::submit(CopyCall call, std::size_t copy_stream) {
  const std::size_t index = copy_stream % lanes_.size();
  auto stream = static_cast<cudaStream_t>(lanes_[index]->stream);
  auto fence = std::make_shared<Fence>();
  const detail::DeviceGuard guard(options_.device, name());
  std::uint64_t calls = 0;
  cudaError_t rc = copy_regions(call, stream, options_.batch_api, calls);
  if (rc == cudaSuccess) rc = cudaEventCreateWithFlags(&fence->event, cudaEventDisableTiming);
  if (rc == cudaSuccess) rc = cudaEventRecord(fence->event, stream);
  {
    const std::lock_guard lock(mutex_);
    calls_ += calls;
  }
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    const auto error = std::make_exception_ptr(TransferError(
        name() + ": the " + to_string(call.kind) + " call of " +
        std::to_string(call.regions.size()) + " region(s) failed: " + detail::describe(rc)));
    // Regions already queued may still run: wait for the stream before handing memory back.
    (void)cudaStreamSynchronize(stream);
    (void)cudaGetLastError();
    if (call.done) call.done(error);
    fence->done.store(true, std::memory_order_release);
    return fence;
  }
  {
    const std::lock_guard lock(mutex_);
    ++outstanding_;
    lanes_[index]->pending.push_back(Pending{fence, std::move(call)});
  }
  wake_.notify_all();
  return fence;
}

void CudaCopyBackend::complete(std::size_t index) {
  Lane& lane = *lanes_[index];
  for (;;) {
    Pending next;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !lane.pending.empty(); });
      if (lane.pending.empty()) return;  // stopping, and every call has completed
      next = std::move(lane.pending.front());
      lane.pending.pop_front();
    }
    const cudaError_t rc = cudaEventSynchronize(next.fence->event);
    std::exception_ptr error;
    if (rc != cudaSuccess && !detail::is_shutdown(rc)) {
      (void)cudaGetLastError();
      error = std::make_exception_ptr(
          TransferError(name() + ": a copy call failed on the device: " + detail::describe(rc)));
    }
    if (next.call.done) next.call.done(error);
    next.fence->done.store(true, std::memory_order_release);
    {
      const std::lock_guard lock(mutex_);
      --outstanding_;
    }
    idle_.notify_all();
  }
}

void CudaCopyBackend::synchronize() {
  std::unique_lock lock(mutex_);
  idle_.wait(lock, [&] { return outstanding_ == 0; });
}

void CudaCopyBackend::stream_wait(const CopyFence& fence, Stream compute_stream) {
  const auto& f = dynamic_cast<const Fence&>(fence);
  if (f.completed() || f.event == nullptr) return;
  const detail::DeviceGuard guard(options_.device, name());
  detail::check(cudaStreamWaitEvent(compute_stream.as_native<CUstream_st>(), f.event, 0), name(),
                "cudaStreamWaitEvent");
}

void CudaCopyBackend::register_host(void* ptr, std::size_t bytes) {
  PinnedHostRegistration registration(ptr, bytes);
  const std::lock_guard lock(mutex_);
  registrations_.emplace(ptr, std::move(registration));
}

void CudaCopyBackend::unregister_host(void* ptr) {
  const std::lock_guard lock(mutex_);
  if (registrations_.erase(ptr) == 0) {
    throw InvalidPointer(name() + ": unregister of memory that is not registered", ptr);
  }
}

MappedBuffer CudaCopyBackend::map_host(std::size_t bytes) {
  if (bytes == 0) return {};
  const detail::DeviceGuard guard(options_.device, name());
  void* host = nullptr;
  detail::check_allocation(cudaHostAlloc(&host, bytes, cudaHostAllocMapped | cudaHostAllocPortable),
                           name(), "cudaHostAlloc", bytes, 0);
  void* device = nullptr;
  const cudaError_t rc = cudaHostGetDevicePointer(&device, host, 0);
  if (rc != cudaSuccess) {
    (void)cudaFreeHost(host);
    detail::throw_error(name(), "cudaHostGetDevicePointer", rc);
  }
  return MappedBuffer{host, device, bytes};
}

void CudaCopyBackend::unmap_host(const MappedBuffer& buffer) {
  if (buffer.host == nullptr) return;
  const cudaError_t rc = cudaFreeHost(buffer.host);
  if (rc != cudaSuccess && !detail::is_shutdown(rc))
    detail::throw_error(name(), "cudaFreeHost", rc);
}

std::uint64_t CudaCopyBackend::calls() const {
  const std::lock_guard lock(mutex_);
  return calls_;
}

}  // namespace sdalloc::cuda
