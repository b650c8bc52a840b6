// sdalloc/trace/event_trace.hpp - the event trace: a program's allocations and frees, in order.
//
// Format (CSV, what TraceResource writes and `sdalloc replay` reads; docs/formats.md):
//     op,id,size[,stream]        header, exactly one of the two forms
//     a,0,4096,0                 allocate 4096 bytes on stream 0 and call the result id 0
//     f,0,4096,0                 free id 0 (the size is repeated and must match)
// `op` is `a` or `f`; id, size and stream are non-negative decimal integers (stream is 0
// when the header has no stream column). Every line has exactly the header's fields. Ids
// are unique: an id is allocated once, and a free must name a live id with its size.
// Allocations still live at the end of the trace are allowed (a trace may stop mid-run).
// CRLF line ends and a final newline are accepted; blank lines are not.
//
// read_event_trace() takes plain or gzip-compressed files transparently ("-" is standard
// input). Every problem is a TraceFormatError whose message is "<source>:<line>: <what is
// wrong>" with the 1-based line; a gzip file that ends early is an error, never a silently
// shorter trace. A file that cannot be opened is a TraceFormatError "<source>: cannot open:
// <reason>" (line 0). The input is streamed within TraceLimits (trace_text.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <istream>
#include <ostream>
#include <string>
#include <vector>

#include "sdalloc/trace/trace_text.hpp"  // TraceFormatError

namespace sdalloc {

struct TraceEvent {
  enum class Op : std::uint8_t { kAlloc, kFree };
  Op op;
  std::uint64_t id;
  std::uint64_t size;
  std::uint64_t stream;
};

struct EventTrace {
  std::string source;  // file name, or what the caller named the stream
  std::vector<TraceEvent> events;

  // Highest sum of sizes of live allocations at any point: the least memory any allocator
  // could serve the trace with.
  std::uint64_t peak_live_bytes() const;
  std::size_t allocation_count() const;
};

// Reads a plain or gzip file, streaming; "-" reads standard input.
EventTrace read_event_trace(const std::string& path, const TraceLimits& limits = {});
// Parses text already open; source_name is used in error messages and as the trace's source.
EventTrace parse_event_trace(std::istream& in, std::string source_name,
                             const TraceLimits& limits = {});
// Writes the trace in the format above: with a stream column unless every stream is 0.
void write_event_trace(const EventTrace& trace, std::ostream& out);

}  // namespace sdalloc
