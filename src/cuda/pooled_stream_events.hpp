// pooled_stream_events.hpp - StreamEvents over a pool of reusable events.
//
// The logic of CudaStreamEvents without CUDA: record() takes an event from a free list (or
// makes one), records it on the stream, and hands it out; release() returns it to the list.
// The events themselves come from an EventBackend: the CUDA one (cuda_stream_events.cpp)
// calls cudaEventCreateWithFlags / cudaEventRecord / cudaEventQuery / ...; tests plug in a
// fake one and drive a CachingPool through real pooling logic on the host.
//
// Thread-safe: the free list and the set of events handed out sit under one mutex; backend
// calls that may be slow (create, record, query, synchronize) run outside it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_set>
#include <vector>

#include "sdalloc/core/stream_events.hpp"
#include "sdalloc/cuda/cuda_stream_events.hpp"

namespace sdalloc::cuda {

// One kind of event object. Handles are never 0 (0 is StreamEvents::kNoEvent).
class EventBackend {
 public:
  using Handle = StreamEvents::Event;
  virtual ~EventBackend() = default;
  virtual Handle create() = 0;                      // a new event, no timing
  virtual void destroy(Handle event) noexcept = 0;  // at the end only
  virtual void record(Handle event, Stream stream) = 0;
  virtual bool query(Handle event) = 0;         // completed? never blocks
  virtual void synchronize(Handle event) = 0;   // waits until completed
  virtual bool stream_idle(Stream stream) = 0;  // all queued work done? never blocks
};

class PooledStreamEvents final : public StreamEvents {
 public:
  explicit PooledStreamEvents(std::unique_ptr<EventBackend> backend);
  ~PooledStreamEvents() override;  // destroys every event it created
  PooledStreamEvents(const PooledStreamEvents&) = delete;
  PooledStreamEvents& operator=(const PooledStreamEvents&) = delete;

  Event record(Stream stream) override;
  bool query(Event event) override;
  void synchronize(Event event) override;
  void release(Event event) override;
  bool idle(Stream stream) override;

  std::size_t events_created() const;
  std::size_t events_pooled() const;
  std::size_t events_in_use() const;
  EventBackend& backend() { return *backend_; }

 private:
  Event take();

  std::unique_ptr<EventBackend> backend_;
  mutable std::mutex mutex_;
  std::vector<Event> free_;           // recorded before, released, ready for reuse
  std::unordered_set<Event> in_use_;  // handed out by record(), not yet released
  std::size_t created_ = 0;
};

}  // namespace sdalloc::cuda
