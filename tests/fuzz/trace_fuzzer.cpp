// trace_fuzzer.cpp - libFuzzer target: the trace readers (event traces, RMM logs, format
// detection) on arbitrary bytes, with a round trip.
//
// Every input either parses or is refused with a TraceFormatError (any other exception, a
// crash or a sanitizer report is a finding). What parses is written back with
// write_event_trace and must read back as the same events with the same peak; an RMM log's
// conversion must itself be a valid event trace (it reads back through the event-trace
// parser).
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

#include "sdalloc/trace/event_trace.hpp"
#include "sdalloc/trace/rmm_log.hpp"
#include "sdalloc/trace/trace_input.hpp"

namespace {

using sdalloc::EventTrace;
using sdalloc::TraceEvent;
using sdalloc::TraceFormatError;

void require(bool ok, const char* what) {
  if (!ok) throw std::logic_error(what);
}

bool same_events(const EventTrace& a, const EventTrace& b) {
  if (a.events.size() != b.events.size()) return false;
  for (std::size_t i = 0; i < a.events.size(); ++i) {
    const TraceEvent& x = a.events[i];
    const TraceEvent& y = b.events[i];
    if (x.op != y.op || x.id != y.id || x.size != y.size || x.stream != y.stream) return false;
  }
  return true;
}

// Writes the trace out and reads it back: it must be the same trace.
void round_trip(const EventTrace& trace) {
  std::stringstream text;
  sdalloc::write_event_trace(trace, text);
  const EventTrace back = sdalloc::parse_event_trace(text, "round-trip");
  require(same_events(trace, back), "write_event_trace then parse_event_trace changed the trace");
  require(back.peak_live_bytes() == trace.peak_live_bytes(), "peak changed in the round trip");
  require(back.allocation_count() == trace.allocation_count(), "count changed in the round trip");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    (void)sdalloc::detect_trace_format(bytes, "fuzz");
  } catch (const TraceFormatError&) {
  }
  try {
    std::istringstream in(bytes);
    round_trip(sdalloc::parse_event_trace(in, "fuzz"));
  } catch (const TraceFormatError&) {
  }
  try {
    const sdalloc::RmmLog log = sdalloc::parse_rmm_log(bytes, "fuzz");
    // Each stream is numbered by the event that first uses it.
    require(log.streams.size() <= log.trace.events.size(), "more streams than events");
    round_trip(log.trace);
  } catch (const TraceFormatError&) {
  }
  return 0;
}
