// sdalloc/trace/event_trace_writer.hpp - the one place that writes the event-trace format.
//
// The format is event_trace.hpp's (docs/formats.md): a header line, `op,id,size` or
// `op,id,size,stream`, then one line per event, `a,<id>,<size>[,<stream>]` or
// `f,<id>,<size>[,<stream>]`, every line ended by '\n'. Whatever writes a trace (the
// TraceResource adaptor, a C API pool's recorder, write_event_trace) goes through
// EventTraceWriter, and whatever reads one recognises the header through
// event_trace_header_fields(), so the writers and readers cannot drift apart.
//
// Numbers are written in decimal whatever the stream's format flags (the format says
// decimal). The writer does not check the events (ids unique, frees matching): that is the
// reader's job, and the writers' callers keep their own tables. Not thread-safe: callers
// that write from several threads serialise the calls (both adaptors hold a mutex). Errors
// are the ostream's: its state says whether writing failed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string_view>

#include "sdalloc/trace/event_trace.hpp"

namespace sdalloc {

// The header line, without its line end.
constexpr std::string_view kEventTraceHeader = "op,id,size";
constexpr std::string_view kEventTraceHeaderWithStream = "op,id,size,stream";

// The number of fields each line of a trace with this header has: 3 or 4; 0 when `line`
// (without its line end) is not an event-trace header.
std::size_t event_trace_header_fields(std::string_view line);

class EventTraceWriter {
 public:
  // Writes the header at once: with the stream column unless with_stream is false (then
  // every event's stream is left out of the text).
  explicit EventTraceWriter(std::ostream& out, bool with_stream = true);

  void allocate(std::uint64_t id, std::uint64_t size, std::uint64_t stream = 0);
  void free(std::uint64_t id, std::uint64_t size, std::uint64_t stream = 0);
  void write(const TraceEvent& event);

  bool with_stream() const { return with_stream_; }

 private:
  void line(char op, std::uint64_t id, std::uint64_t size, std::uint64_t stream);

  std::ostream& out_;
  bool with_stream_;
};

}  // namespace sdalloc
