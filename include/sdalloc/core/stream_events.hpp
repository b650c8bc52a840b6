// sdalloc/core/stream_events.hpp - how a pool learns that a stream's work has finished.
//
// A block freed on stream S may be reused at once on S. Reusing it on another stream T is
// safe only once the work queued on S before the free has completed. Pools ask this hook:
// they record an event on S when such a free happens, poll it (never block) on the
// allocation path, and wait for it only on the out-of-memory path, before giving up. To
// move a whole cached segment from S to T they ask whether S is idle, again without waiting.
//
// HostStreamEvents is the implementation for host memory, where nothing is queued: record()
// returns kNoEvent, meaning "already complete", so cross-stream reuse is immediate. The CUDA
// backend plugs in cudaEventRecord / cudaEventQuery / cudaEventSynchronize, with a pool of
// reusable events behind record() and release().
//
// Implementations must be thread-safe: several pool shards call them at once.
#pragma once

#include <cstdint>

#include "sdalloc/core/stream.hpp"

namespace sdalloc {

class StreamEvents {
 public:
  using Event = std::uintptr_t;
  static constexpr Event kNoEvent = 0;  // nothing to wait for

  virtual ~StreamEvents() = default;

  // An event that completes when all work queued on `stream` so far is done, or kNoEvent.
  virtual Event record(Stream stream) = 0;
  // Non-blocking: has the event completed? Always true for kNoEvent.
  virtual bool query(Event event) = 0;
  // Blocks until the event has completed. A no-op for kNoEvent.
  virtual void synchronize(Event event) = 0;
  // Gives the event back once the pool no longer needs it. A no-op for kNoEvent.
  virtual void release(Event event) = 0;
  // Non-blocking: has all work queued on `stream` so far completed (cudaStreamQuery)?
  // A pool asks before moving a cached segment away from the stream that last used it.
  virtual bool idle(Stream stream) = 0;
};

class HostStreamEvents final : public StreamEvents {
 public:
  Event record(Stream) override { return kNoEvent; }
  bool query(Event) override { return true; }
  void synchronize(Event) override {}
  void release(Event) override {}
  bool idle(Stream) override { return true; }

  // One shared instance: stateless, so every host pool may use it.
  static HostStreamEvents& instance();
};

}  // namespace sdalloc
