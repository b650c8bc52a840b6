// sdalloc/cuda/cuda_stream_events.hpp - CUDA events for a pool's cross-stream frees.
//
// CudaStreamEvents is the StreamEvents hook (sdalloc/core/stream_events.hpp) for device memory.
// Give one to a CachingPool over device memory of the same device:
//
//   sdalloc::cuda::CudaResource device_memory(0);
//   sdalloc::cuda::CudaStreamEvents events(0);
//   sdalloc::CachingPoolOptions options;
//   options.stream_events = &events;     // must outlive the pool
//   sdalloc::CachingPool pool(device_memory, options);
//
// What the pool then does (see caching_pool.hpp): a block allocated on stream T and freed on
// S != T, or used on S through record_stream, is not reused at once; the pool records an
// event on S (cudaEventRecord) and keeps the block pending. The allocation path polls the
// pending events (cudaEventQuery: never blocks) and reuses the block once they completed.
// Only trim() and the out-of-memory path wait (cudaEventSynchronize). A cached segment moves
// to another stream only when its last stream is idle (cudaStreamQuery).
//
// Events are pooled: record() takes an event from a free list (creating one with
// cudaEventDisableTiming only when the list is empty) and release() puts it back, so a
// steady workload creates no events after warm-up. All events are destroyed with this
// object; the pools using it must be destroyed first (they release their events).
//
// Thread-safe: one mutex guards the free list; CUDA calls run outside it where possible.
// Errors: the constructor throws CudaError without a usable driver or device and
// InvalidArgument for a device out of range; record/query/synchronize/idle throw CudaError
// when CUDA reports an error (cudaErrorNotReady is an answer, not an error, and is cleared);
// release of an event this object did not hand out throws InvalidArgument.
#pragma once

#include <cstddef>
#include <memory>

#include "sdalloc/core/stream_events.hpp"

namespace sdalloc::cuda {

class PooledStreamEvents;

class CudaStreamEvents final : public StreamEvents {
 public:
  explicit CudaStreamEvents(int device = 0);
  ~CudaStreamEvents() override;
  CudaStreamEvents(const CudaStreamEvents&) = delete;
  CudaStreamEvents& operator=(const CudaStreamEvents&) = delete;

  Event record(Stream stream) override;
  bool query(Event event) override;
  void synchronize(Event event) override;
  void release(Event event) override;
  bool idle(Stream stream) override;

  int device() const { return device_; }
  // Events created so far, and how many of them wait in the free list now.
  std::size_t events_created() const;
  std::size_t events_pooled() const;

 private:
  int device_;
  std::unique_ptr<PooledStreamEvents> events_;
};

}  // namespace sdalloc::cuda
