// tools/sdalloc/replay/prepared_trace.hpp - an event trace made ready to replay at full speed.
//
// Trace ids are arbitrary 64-bit numbers; a replay loop that looked them up in a hash map
// would time the map, not the allocator. PreparedTrace numbers the allocations densely
// (slot k = the k-th allocation), so the loop keeps live pointers in a flat vector.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "sdalloc/trace/event_trace.hpp"

namespace sdalloc::replay {

struct PreparedEvent {
  bool is_alloc;
  std::uint32_t slot;
  std::uint64_t size;
  std::uint64_t stream;
};

struct PreparedTrace {
  std::vector<PreparedEvent> events;
  std::size_t slots = 0;        // allocations in one pass
  std::uint64_t peak_live = 0;  // the trace's peak live bytes

  // The trace must be valid (read_event_trace checks it): every free names a live id.
  static PreparedTrace from(const EventTrace& trace);
};

}  // namespace sdalloc::replay
