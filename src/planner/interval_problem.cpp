// Interval problems on disk and from event traces: MiniMalloc's CSV (`id,lower,upper,size`)
// in, `id,lower,upper,size,offset` out, and an EventTrace turned into buffers with
// time = event index. Lines are read one bounded line at a time (an input with no line end,
// /dev/zero, fails at 1 MiB), and input text in messages is escaped (trace/quoted.hpp).
#include <charconv>
#include <cstdint>
#include <fstream>
#include <istream>
#include <ostream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/planner/planner.hpp"
#include "sdalloc/trace/event_trace.hpp"
#include "trace/quoted.hpp"

namespace sdalloc {
namespace {

[[noreturn]] void fail(const std::string& source, std::size_t line, const std::string& what) {
  throw InvalidArgument(source + ":" + std::to_string(line) + ": " + what);
}

std::vector<std::string_view> split_fields(std::string_view text) {
  std::vector<std::string_view> fields;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = text.find(',', start);
    if (comma == std::string_view::npos) {
      fields.push_back(text.substr(start));
      return fields;
    }
    fields.push_back(text.substr(start, comma - start));
    start = comma + 1;
  }
}

constexpr std::size_t kMaxLineBytes = std::size_t{1} << 20;

// std::getline, but failing on a line longer than kMaxLineBytes instead of growing without end.
bool read_line(std::istream& in, std::string& text, const std::string& source, std::size_t line) {
  text.clear();
  std::streambuf* buffer = in.rdbuf();
  if (buffer == nullptr) return false;
  for (;;) {
    const int c = buffer->sbumpc();
    if (c == std::char_traits<char>::eof()) return !text.empty();
    if (c == '\n') return true;
    if (text.size() == kMaxLineBytes) {
      fail(source, line, "line is longer than " + std::to_string(kMaxLineBytes) + " bytes");
    }
    text.push_back(static_cast<char>(c));
  }
}

template <typename Int>
Int parse_field(std::string_view field, const char* name, const std::string& source,
                std::size_t line) {
  Int value{};
  const auto [end, error] = std::from_chars(field.data(), field.data() + field.size(), value);
  if (field.empty() || error != std::errc() || end != field.data() + field.size()) {
    fail(
        source, line,
        std::string("bad ") + name + " " + detail::quoted(field) + " (expected a decimal integer)");
  }
  return value;
}

}  // namespace

std::vector<Buffer> parse_interval_csv(std::istream& in, const std::string& source_name) {
  std::vector<Buffer> buffers;
  std::unordered_map<std::uint64_t, std::size_t> line_of_id;
  std::string text;
  std::size_t line = 0;
  std::size_t columns = 0;
  while (read_line(in, text, source_name, line + 1)) {
    ++line;
    if (!text.empty() && text.back() == '\r') text.pop_back();
    const std::vector<std::string_view> fields = split_fields(text);
    if (line == 1) {
      if (text == "id,lower,upper,size") {
        columns = 4;
      } else if (text == "id,lower,upper,size,offset") {
        columns = 5;
      } else {
        fail(source_name, line,
             "header must be 'id,lower,upper,size' (got " + detail::quoted(text) + ")");
      }
      continue;
    }
    if (fields.size() != columns) {
      fail(source_name, line,
           "expected " + std::to_string(columns) + " fields, got " + std::to_string(fields.size()));
    }
    Buffer buffer{};
    buffer.id = parse_field<std::uint64_t>(fields[0], "id", source_name, line);
    buffer.lower = parse_field<std::int64_t>(fields[1], "lower", source_name, line);
    buffer.upper = parse_field<std::int64_t>(fields[2], "upper", source_name, line);
    buffer.size = parse_field<std::uint64_t>(fields[3], "size", source_name, line);
    for (const std::int64_t t : {buffer.lower, buffer.upper}) {
      if (t < -kMaxTime || t > kMaxTime) {
        fail(source_name, line,
             "time " + std::to_string(t) + " out of range (times must lie within +-2^62)");
      }
    }
    if (buffer.upper <= buffer.lower) {
      fail(source_name, line, "upper must be greater than lower");
    }
    if (buffer.size == 0) fail(source_name, line, "size must be positive");
    const auto [it, inserted] = line_of_id.emplace(buffer.id, line);
    if (!inserted) {
      fail(source_name, line,
           "duplicate id " + std::to_string(buffer.id) + " (first on line " +
               std::to_string(it->second) + ")");
    }
    buffers.push_back(buffer);
  }
  if (line == 0) fail(source_name, 0, "empty file (no header)");
  return buffers;
}

std::vector<Buffer> read_interval_csv(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InvalidArgument(path + ": cannot open");
  return parse_interval_csv(in, path);
}

void write_plan_csv(std::span<const Buffer> buffers, const Plan& plan, std::ostream& out) {
  out << "id,lower,upper,size,offset\n";
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    const Buffer& b = buffers[i];
    out << b.id << ',' << b.lower << ',' << b.upper << ',' << b.size << ',' << plan.offsets[i]
        << '\n';
  }
}

std::vector<Buffer> buffers_from_trace(const EventTrace& trace) {
  std::vector<Buffer> buffers;
  std::unordered_map<std::uint64_t, std::size_t> live;  // trace id -> index in buffers
  for (std::size_t i = 0; i < trace.events.size(); ++i) {
    const TraceEvent& event = trace.events[i];
    const auto time = static_cast<std::int64_t>(i);
    if (event.op == TraceEvent::Op::kAlloc) {
      live[event.id] = buffers.size();
      buffers.push_back(Buffer{.id = event.id, .lower = time, .upper = -1, .size = event.size});
    } else {
      const auto it = live.find(event.id);
      if (it == live.end()) {
        throw InvalidArgument(trace.source + ": event " + std::to_string(i) + " frees id " +
                              std::to_string(event.id) + " which is not live");
      }
      buffers[it->second].upper = time;
      live.erase(it);
    }
  }
  const auto end = static_cast<std::int64_t>(trace.events.size());
  for (Buffer& buffer : buffers) {
    if (buffer.upper < 0) buffer.upper = end;
  }
  // A zero-byte allocation needs no memory; give it one byte so every buffer is well formed
  // and the plan still lists it.
  for (Buffer& buffer : buffers) {
    if (buffer.size == 0) buffer.size = 1;
  }
  return buffers;
}

}  // namespace sdalloc
