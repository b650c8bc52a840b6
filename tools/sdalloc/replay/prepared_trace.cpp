#include "replay/prepared_trace.hpp"

#include <unordered_map>

#include "sdalloc/core/errors.hpp"

namespace sdalloc::replay {

PreparedTrace PreparedTrace::from(const EventTrace& trace) {
  PreparedTrace prepared;
  prepared.events.reserve(trace.events.size());
  std::unordered_map<std::uint64_t, std::uint32_t> slot_of;
  for (const TraceEvent& e : trace.events) {
    if (e.op == TraceEvent::Op::kAlloc) {
      const auto slot = static_cast<std::uint32_t>(prepared.slots++);
      slot_of[e.id] = slot;
      prepared.events.push_back(PreparedEvent{true, slot, e.size, e.stream});
    } else {
      const auto it = slot_of.find(e.id);
      if (it == slot_of.end()) {
        throw InvalidArgument(trace.source + ": free of id " + std::to_string(e.id) +
                              " that is not live");
      }
      prepared.events.push_back(PreparedEvent{false, it->second, e.size, e.stream});
      slot_of.erase(it);
    }
  }
  prepared.peak_live = trace.peak_live_bytes();
  return prepared;
}

}  // namespace sdalloc::replay
