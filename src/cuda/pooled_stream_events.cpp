// pooled_stream_events.cpp - reusable events behind the StreamEvents hook.
#include "pooled_stream_events.hpp"

#include <utility>

#include "sdalloc/core/errors.hpp"

namespace sdalloc::cuda {

PooledStreamEvents::PooledStreamEvents(std::unique_ptr<EventBackend> backend)
    : backend_(std::move(backend)) {}

PooledStreamEvents::~PooledStreamEvents() {
  for (Event e : free_) backend_->destroy(e);
  // Events never released belong to a pool that outlived this object, against the rules;
  // they are destroyed all the same, so nothing leaks.
  for (Event e : in_use_) backend_->destroy(e);
}

StreamEvents::Event PooledStreamEvents::take() {
  {
    std::lock_guard lock(mutex_);
    if (!free_.empty()) {
      const Event e = free_.back();
      free_.pop_back();
      in_use_.insert(e);
      return e;
    }
  }
  const Event e = backend_->create();
  std::lock_guard lock(mutex_);
  try {
    // Room in the free list for every event, so release() never allocates.
    free_.reserve(created_ + 1);
    in_use_.insert(e);
  } catch (...) {
    backend_->destroy(e);
    throw;
  }
  ++created_;
  return e;
}

StreamEvents::Event PooledStreamEvents::record(Stream stream) {
  const Event e = take();
  try {
    backend_->record(e, stream);
  } catch (...) {
    release(e);
    throw;
  }
  return e;
}

bool PooledStreamEvents::query(Event event) {
  if (event == kNoEvent) return true;
  return backend_->query(event);
}

void PooledStreamEvents::synchronize(Event event) {
  if (event == kNoEvent) return;
  backend_->synchronize(event);
}

void PooledStreamEvents::release(Event event) {
  if (event == kNoEvent) return;
  std::lock_guard lock(mutex_);
  if (in_use_.erase(event) == 0) {
    throw InvalidArgument("stream events: release of event " + std::to_string(event) +
                          ", which is not in use (released twice, or never recorded here)");
  }
  // Cannot fail for lack of memory: take() reserved room for every event created.
  free_.push_back(event);
}

bool PooledStreamEvents::idle(Stream stream) { return backend_->stream_idle(stream); }

std::size_t PooledStreamEvents::events_created() const {
  std::lock_guard lock(mutex_);
  return created_;
}

std::size_t PooledStreamEvents::events_pooled() const {
  std::lock_guard lock(mutex_);
  return free_.size();
}

std::size_t PooledStreamEvents::events_in_use() const {
  std::lock_guard lock(mutex_);
  return in_use_.size();
}

}  // namespace sdalloc::cuda
