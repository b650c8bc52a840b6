// fake_event_backend.hpp - CUDA events simulated on the host, for PooledStreamEvents.
//
// Streams carry "queued work" that finishes only when the test says so: launch(s) queues
// work on s, finish(s) completes it. An event recorded on s completes when the work queued
// on s before it has finished (at once on an idle stream), as cudaEventRecord's do.
// synchronize() on an incomplete event finishes its stream (what waiting would achieve)
// and is counted, so tests can assert that the allocation path never waits. Every call is
// counted; misuse (recording, querying or destroying an unknown or destroyed event)
// is counted as well. Thread-safe: one mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>

#include "pooled_stream_events.hpp"

namespace sdalloc::cuda::test {

class FakeEventBackend final : public EventBackend {
 public:
  struct Counts {
    std::size_t creates = 0, destroys = 0, records = 0, queries = 0, synchronizes = 0,
                stream_queries = 0, misuses = 0;
  };

  Handle create() override {
    std::lock_guard lock(mutex_);
    if (fail_next_create_) {
      fail_next_create_ = false;
      throw std::runtime_error("fake cudaEventCreateWithFlags failure");
    }
    ++counts_.creates;
    const Handle h = next_;
    next_ += 16;  // looks like a pointer, never 0
    events_[h] = Event{};
    return h;
  }

  void destroy(Handle event) noexcept override {
    std::lock_guard lock(mutex_);
    ++counts_.destroys;
    if (events_.erase(event) == 0) ++counts_.misuses;
  }

  void record(Handle event, Stream stream) override {
    std::lock_guard lock(mutex_);
    if (fail_next_record_) {
      fail_next_record_ = false;
      throw std::runtime_error("fake cudaEventRecord failure");
    }
    ++counts_.records;
    auto it = events_.find(event);
    if (it == events_.end()) {
      ++counts_.misuses;
      return;
    }
    it->second.stream = stream.handle;
    it->second.complete = busy_.count(stream.handle) == 0;
  }

  bool query(Handle event) override {
    std::lock_guard lock(mutex_);
    ++counts_.queries;
    auto it = events_.find(event);
    if (it == events_.end()) {
      ++counts_.misuses;
      return true;
    }
    return it->second.complete;
  }

  void synchronize(Handle event) override {
    std::lock_guard lock(mutex_);
    ++counts_.synchronizes;
    auto it = events_.find(event);
    if (it == events_.end()) {
      ++counts_.misuses;
      return;
    }
    if (!it->second.complete) finish_locked(it->second.stream);
  }

  bool stream_idle(Stream stream) override {
    std::lock_guard lock(mutex_);
    ++counts_.stream_queries;
    return busy_.count(stream.handle) == 0;
  }

  // The test queues work on `stream`; it runs until finish(stream).
  void launch(Stream stream) {
    std::lock_guard lock(mutex_);
    busy_.insert(stream.handle);
  }
  void finish(Stream stream) {
    std::lock_guard lock(mutex_);
    finish_locked(stream.handle);
  }
  void fail_next_create() {
    std::lock_guard lock(mutex_);
    fail_next_create_ = true;
  }
  void fail_next_record() {
    std::lock_guard lock(mutex_);
    fail_next_record_ = true;
  }
  Counts counts() const {
    std::lock_guard lock(mutex_);
    return counts_;
  }
  std::size_t live_events() const {
    std::lock_guard lock(mutex_);
    return events_.size();
  }

 private:
  struct Event {
    std::uintptr_t stream = 0;
    bool complete = true;
  };

  void finish_locked(std::uintptr_t stream) {
    busy_.erase(stream);
    for (auto& [handle, event] : events_) {
      if (event.stream == stream) event.complete = true;
    }
  }

  mutable std::mutex mutex_;
  std::map<Handle, Event> events_;
  std::set<std::uintptr_t> busy_;
  Handle next_ = 0x1000;
  bool fail_next_create_ = false;
  bool fail_next_record_ = false;
  Counts counts_;
};

// Hands every call to a FakeEventBackend the test owns, so the test can still read the
// fake's figures after the PooledStreamEvents (which owns its backend) is destroyed.
class ForwardingEventBackend final : public EventBackend {
 public:
  explicit ForwardingEventBackend(FakeEventBackend& target) : target_(target) {}
  Handle create() override { return target_.create(); }
  void destroy(Handle event) noexcept override { target_.destroy(event); }
  void record(Handle event, Stream stream) override { target_.record(event, stream); }
  bool query(Handle event) override { return target_.query(event); }
  void synchronize(Handle event) override { target_.synchronize(event); }
  bool stream_idle(Stream stream) override { return target_.stream_idle(stream); }

 private:
  FakeEventBackend& target_;
};

}  // namespace sdalloc::cuda::test
