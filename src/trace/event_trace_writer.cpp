// event_trace_writer.cpp - formatting event-trace lines (event_trace_writer.hpp).
//
// Each line is formatted into a small buffer and handed to the stream in one write: no
// locale, no format flags, and one call per line however the stream buffers.
#include "sdalloc/trace/event_trace_writer.hpp"

#include <array>

namespace sdalloc {
namespace {

// Writes `value` in decimal at `out` (at most 20 digits); answers the end.
char* put_decimal(char* out, std::uint64_t value) {
  std::array<char, 20> digits;
  std::size_t count = 0;
  do {
    digits[count++] = static_cast<char>('0' + value % 10);
    value /= 10;
  } while (value != 0);
  while (count != 0) *out++ = digits[--count];
  return out;
}

}  // namespace

std::size_t event_trace_header_fields(std::string_view line) {
  if (line == kEventTraceHeader) return 3;
  if (line == kEventTraceHeaderWithStream) return 4;
  return 0;
}

EventTraceWriter::EventTraceWriter(std::ostream& out, bool with_stream)
    : out_(out), with_stream_(with_stream) {
  const std::string_view header = with_stream ? kEventTraceHeaderWithStream : kEventTraceHeader;
  out_.write(header.data(), static_cast<std::streamsize>(header.size()));
  out_.put('\n');
}

void EventTraceWriter::allocate(std::uint64_t id, std::uint64_t size, std::uint64_t stream) {
  line('a', id, size, stream);
}

void EventTraceWriter::free(std::uint64_t id, std::uint64_t size, std::uint64_t stream) {
  line('f', id, size, stream);
}

void EventTraceWriter::write(const TraceEvent& event) {
  line(event.op == TraceEvent::Op::kAlloc ? 'a' : 'f', event.id, event.size, event.stream);
}

void EventTraceWriter::line(char op, std::uint64_t id, std::uint64_t size, std::uint64_t stream) {
  // "x," and three 20-digit numbers with their separators and the line end fit in 65 bytes.
  std::array<char, 72> text;
  char* end = text.data();
  *end++ = op;
  *end++ = ',';
  end = put_decimal(end, id);
  *end++ = ',';
  end = put_decimal(end, size);
  if (with_stream_) {
    *end++ = ',';
    end = put_decimal(end, stream);
  }
  *end++ = '\n';
  out_.write(text.data(), end - text.data());
}

}  // namespace sdalloc
