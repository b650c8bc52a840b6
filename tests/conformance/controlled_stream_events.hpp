// controlled_stream_events.hpp - stream events that complete only when the test says so.
//
// A StreamEvents implementation for testing a pool's cross-stream rules on the host: every
// record() returns a new event that stays incomplete until complete_all() (the test's "the
// device finished the work") or until the pool calls synchronize() (which a real backend
// would block on; here it completes the event at once and is counted, so a test can assert
// that the allocation path never waits and that trim / out-of-memory do). Likewise idle()
// answers that every stream is busy (work may be queued on it) from construction until
// complete_all(), so a pool may not move a cached segment between streams before then.
// It also catches misuse: querying, synchronizing or releasing an event that was never
// recorded or is already released counts as a misuse.
// Thread-safe: one mutex, as pool shards call it concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "sdalloc/core/stream_events.hpp"

namespace sdalloc::conformance {

class ControlledStreamEvents final : public StreamEvents {
 public:
  Event record(Stream stream) override {
    std::lock_guard<std::mutex> lock(mutex_);
    const Event event = next_++;
    events_.emplace(event, State{stream});
    device_idle_ = false;
    return event;
  }

  bool query(Event event) override {
    if (event == kNoEvent) return true;
    std::lock_guard<std::mutex> lock(mutex_);
    State* state = find(event);
    return state == nullptr || state->complete;
  }

  void synchronize(Event event) override {
    if (event == kNoEvent) return;
    std::lock_guard<std::mutex> lock(mutex_);
    ++synchronizations_;
    if (State* state = find(event)) state->complete = true;
  }

  void release(Event event) override {
    if (event == kNoEvent) return;
    std::lock_guard<std::mutex> lock(mutex_);
    if (State* state = find(event)) state->released = true;
  }

  // Streams count as busy (work may be queued on them) until complete_all().
  bool idle(Stream) override {
    std::lock_guard<std::mutex> lock(mutex_);
    return device_idle_;
  }

  // The device has finished everything queued so far.
  void complete_all() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [event, state] : events_) state.complete = true;
    device_idle_ = true;
  }

  bool all_complete() const {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [event, state] : events_) {
      if (!state.complete) return false;
    }
    return true;
  }

  std::size_t recorded() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return events_.size();
  }

  std::size_t recorded_on(Stream stream) const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::size_t count = 0;
    for (const auto& [event, state] : events_) count += state.stream == stream ? 1 : 0;
    return count;
  }

  // Events recorded and not yet released: once nothing is pending, a pool holds none.
  std::size_t unreleased() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::size_t count = 0;
    for (const auto& [event, state] : events_) count += state.released ? 0 : 1;
    return count;
  }

  std::size_t synchronizations() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return synchronizations_;
  }

  std::size_t misuses() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return misuses_;
  }

 private:
  struct State {
    Stream stream;
    bool complete = false;
    bool released = false;
  };

  // The live state of `event`, or nullptr (and a misuse) if it is unknown or released.
  State* find(Event event) {
    auto it = events_.find(event);
    if (it == events_.end() || it->second.released) {
      ++misuses_;
      return nullptr;
    }
    return &it->second;
  }

  mutable std::mutex mutex_;
  Event next_ = 1;  // 0 is kNoEvent
  std::unordered_map<Event, State> events_;
  std::size_t synchronizations_ = 0;
  std::size_t misuses_ = 0;
  bool device_idle_ = false;
};

}  // namespace sdalloc::conformance
