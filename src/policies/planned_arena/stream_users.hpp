// policies/planned_arena/stream_users.hpp - the other streams that use a live buffer of the
// arena or of the recording (PyTorch's record_stream).
//
// When such a buffer is freed, an event is recorded on each stream that used it: arena
// memory is not reused until those events complete (SharedArena waits at begin_step and
// before any release), and a recording block is neither cached nor released before they do
// (its free waits). Invariant: each pointer lists a stream at most once, and is forgotten
// once its free has recorded the events. Not thread-safe: PlannedArena's mutex guards it.
#pragma once

#include <algorithm>
#include <unordered_map>
#include <vector>

#include "sdalloc/core/stream.hpp"
#include "sdalloc/core/stream_events.hpp"

namespace sdalloc::planned_arena_detail {

class StreamUsers {
 public:
  // Work on `stream` also uses the live buffer p.
  void add(void* p, Stream stream) {
    std::vector<Stream>& streams = used_on_[p];
    if (std::find(streams.begin(), streams.end(), stream) == streams.end()) {
      streams.push_back(stream);
    }
  }

  // p is being freed: appends to `recorded` an event on each stream that used it, which the
  // free must honour, and forgets p. False when no stream was named for p.
  bool record_events(void* p, StreamEvents& events, std::vector<StreamEvents::Event>& recorded) {
    const auto it = used_on_.find(p);
    if (it == used_on_.end()) return false;
    for (const Stream s : it->second) {
      if (const StreamEvents::Event e = events.record(s); e != StreamEvents::kNoEvent) {
        recorded.push_back(e);
      }
    }
    used_on_.erase(it);
    return true;
  }

 private:
  std::unordered_map<void*, std::vector<Stream>> used_on_;
};

}  // namespace sdalloc::planned_arena_detail
