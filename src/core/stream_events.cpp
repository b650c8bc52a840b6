// stream_events.cpp - the shared host implementation of the stream-event hook.
#include "sdalloc/core/stream_events.hpp"

namespace sdalloc {

HostStreamEvents& HostStreamEvents::instance() {
  // Stateless, so one instance serves every pool and thread; a function-local static is
  // constructed once, thread-safely, on first use.
  static HostStreamEvents events;
  return events;
}

}  // namespace sdalloc
