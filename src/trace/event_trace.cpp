// event_trace.cpp - reading, checking and writing event traces.
//
// The text is streamed a chunk at a time (text_lines.hpp: through zlib, which passes plain
// files through unchanged), split into lines and fields by hand: no regex, no stream
// extraction per field, so a 100k-line trace parses in milliseconds. Validation keeps one record
// per id (its size and the lines that allocated and freed it) so every error can point at both the
// offending line and the earlier line it conflicts with.
#include "sdalloc/trace/event_trace.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "sdalloc/trace/event_trace_writer.hpp"
#include "sdalloc/trace/trace_text.hpp"
#include "trace/decimal_field.hpp"
#include "trace/quoted.hpp"
#include "trace/text_lines.hpp"
#include "trace/trace_parsers.hpp"

namespace sdalloc {
namespace {

using detail::quoted;
using detail::TextLines;

constexpr std::string_view kHeader3 = kEventTraceHeader;
constexpr std::string_view kHeader4 = kEventTraceHeaderWithStream;

// ---------------------------------------------------------------------------------------
// Parsing.

struct IdRecord {
  std::uint64_t size;
  std::size_t alloc_line;
  std::size_t free_line;  // 0 while live
};

class TraceParser {
 public:
  explicit TraceParser(TextLines& lines) : lines_(lines) {}

  EventTrace parse() {
    EventTrace trace;
    trace.source = lines_.source();
    std::string_view line;
    while (lines_.next(line)) {
      if (lines_.number() == 1) {
        read_header(line);
        continue;
      }
      trace.events.push_back(read_event(line));
    }
    if (lines_.number() == 0)
      fail("empty trace: expected the header 'op,id,size' or 'op,id,size,stream'");
    return trace;
  }

 private:
  [[noreturn]] void fail(const std::string& problem) const { lines_.fail(problem); }

  void read_header(std::string_view line) {
    fields_ = event_trace_header_fields(line);
    if (fields_ == 0) {
      fail("bad header " + quoted(line) + ": expected 'op,id,size' or 'op,id,size,stream'");
    }
  }

  TraceEvent read_event(std::string_view line) {
    if (line.empty()) fail("empty line (every line after the header is one event)");
    std::array<std::string_view, 4> field;
    std::size_t count = 0;
    std::size_t start = 0;
    for (;;) {
      const std::size_t comma = line.find(',', start);
      const std::string_view text = line.substr(start, comma - start);
      if (count < field.size()) field[count] = text;
      ++count;
      if (comma == std::string_view::npos) break;
      start = comma + 1;
    }
    if (count != fields_) {
      fail("expected " + std::to_string(fields_) + " fields (" +
           std::string(fields_ == 3 ? kHeader3 : kHeader4) + "), found " + std::to_string(count) +
           " in " + quoted(line));
    }

    TraceEvent event{};
    if (field[0] == "a") {
      event.op = TraceEvent::Op::kAlloc;
    } else if (field[0] == "f") {
      event.op = TraceEvent::Op::kFree;
    } else {
      fail("unknown op " + quoted(field[0]) + " (expected 'a' or 'f')");
    }
    event.id = number("id", field[1]);
    event.size = number("size", field[2]);
    event.stream = fields_ == 4 ? number("stream", field[3]) : 0;

    if (event.op == TraceEvent::Op::kAlloc) {
      check_alloc(event);
    } else {
      check_free(event);
    }
    return event;
  }

  std::uint64_t number(const char* what, std::string_view text) const {
    std::uint64_t value = 0;
    std::string fault;
    if (!detail::parse_decimal_field(what, text, value, fault)) fail(fault);
    return value;
  }

  void check_alloc(const TraceEvent& event) {
    auto [it, inserted] = ids_.try_emplace(event.id, IdRecord{event.size, lines_.number(), 0});
    if (!inserted) {
      const IdRecord& old = it->second;
      std::string history = "allocated on line " + std::to_string(old.alloc_line);
      if (old.free_line != 0) history += " and freed on line " + std::to_string(old.free_line);
      fail("allocation of id " + std::to_string(event.id) + ", which was already " + history +
           " (ids must be unique)");
    }
    if (event.size > std::numeric_limits<std::uint64_t>::max() - live_bytes_) {
      fail("live bytes exceed 2^64 - 1");
    }
    live_bytes_ += event.size;
  }

  void check_free(const TraceEvent& event) {
    auto it = ids_.find(event.id);
    if (it == ids_.end()) {
      fail("free of id " + std::to_string(event.id) + ", which was never allocated");
    }
    IdRecord& record = it->second;
    if (record.free_line != 0) {
      fail("free of id " + std::to_string(event.id) + ", which was already freed on line " +
           std::to_string(record.free_line));
    }
    if (record.size != event.size) {
      fail("free of id " + std::to_string(event.id) + " with size " + std::to_string(event.size) +
           ", but it was allocated with size " + std::to_string(record.size) + " on line " +
           std::to_string(record.alloc_line));
    }
    record.free_line = lines_.number();
    live_bytes_ -= event.size;
  }

  TextLines& lines_;
  std::size_t fields_ = 0;
  std::uint64_t live_bytes_ = 0;
  std::unordered_map<std::uint64_t, IdRecord> ids_;
};

}  // namespace

// ---------------------------------------------------------------------------------------

std::uint64_t EventTrace::peak_live_bytes() const {
  std::uint64_t live = 0;
  std::uint64_t peak = 0;
  for (const TraceEvent& event : events) {
    if (event.op == TraceEvent::Op::kAlloc) {
      live += event.size;
      if (live > peak) peak = live;
    } else {
      live -= event.size < live ? event.size : live;
    }
  }
  return peak;
}

std::size_t EventTrace::allocation_count() const {
  std::size_t count = 0;
  for (const TraceEvent& event : events) count += event.op == TraceEvent::Op::kAlloc ? 1 : 0;
  return count;
}

EventTrace detail::parse_event_lines(TextLines& lines) { return TraceParser(lines).parse(); }

EventTrace read_event_trace(const std::string& path, const TraceLimits& limits) {
  TextLines lines = TextLines::open(path, limits);
  return detail::parse_event_lines(lines);
}

EventTrace parse_event_trace(std::istream& in, std::string source_name, const TraceLimits& limits) {
  TextLines lines(std::move(source_name), in, limits);
  return detail::parse_event_lines(lines);
}

void write_event_trace(const EventTrace& trace, std::ostream& out) {
  bool streams = false;
  for (const TraceEvent& event : trace.events) streams = streams || event.stream != 0;
  EventTraceWriter writer(out, streams);
  for (const TraceEvent& event : trace.events) writer.write(event);
}

}  // namespace sdalloc
