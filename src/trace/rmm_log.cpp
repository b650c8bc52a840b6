// rmm_log.cpp - converting RMM's logging_resource_adaptor CSV to an event trace.
//
// One pass over the text, streamed (text_lines.hpp): split lines and fields by hand (as
// event_trace.cpp does), keep a table from each live pointer to its id, size and line, so a bad
// free can name both its own line and the line that allocated the pointer, and a table from stream
// handle to its small number.
#include "sdalloc/trace/rmm_log.hpp"

#include <array>
#include <charconv>
#include <limits>
#include <unordered_map>
#include <utility>

#include "sdalloc/trace/trace_text.hpp"
#include "trace/decimal_field.hpp"
#include "trace/quoted.hpp"
#include "trace/text_lines.hpp"
#include "trace/trace_parsers.hpp"

namespace sdalloc {
namespace {

using detail::quoted;

std::string hex(std::uint64_t value) {
  std::array<char, 20> digits;
  const auto result = std::to_chars(digits.data(), digits.data() + digits.size(), value, 16);
  return "0x" + std::string(digits.data(), result.ptr);
}

enum class Action { kAllocate, kFree, kAllocateFailure };

struct LiveAllocation {
  std::uint64_t id;
  std::uint64_t size;
  std::size_t line;
};

class RmmLogParser {
 public:
  explicit RmmLogParser(detail::TextLines& lines) : lines_(lines) {}

  RmmLog parse() {
    log_.trace.source = lines_.source();
    std::string_view line;
    while (lines_.next(line)) {
      if (lines_.number() == 1) {
        if (line != kRmmLogHeader) {
          fail("bad header " + quoted(line) + ": expected " + quoted(kRmmLogHeader) +
               " (RMM logging_resource_adaptor)");
        }
        continue;
      }
      read_line(line);
    }
    if (lines_.number() == 0) fail("empty log: expected the header " + quoted(kRmmLogHeader));
    return std::move(log_);
  }

 private:
  [[noreturn]] void fail(const std::string& problem) const { lines_.fail(problem); }

  void read_line(std::string_view line) {
    if (line.empty()) fail("empty line (every line after the header is one call)");
    std::array<std::string_view, 6> field;
    std::size_t count = 0;
    std::size_t start = 0;
    for (;;) {
      const std::size_t comma = line.find(',', start);
      if (count < field.size()) field[count] = line.substr(start, comma - start);
      ++count;
      if (comma == std::string_view::npos) break;
      start = comma + 1;
    }
    if (count != field.size()) {
      fail("expected 6 fields (" + std::string(kRmmLogHeader) + "), found " +
           std::to_string(count) + " in " + quoted(line));
    }
    const Action action = read_action(field[2]);
    const std::uint64_t pointer = read_pointer(field[3]);
    const std::uint64_t size = read_decimal("size", field[4]);
    // Checked on every line, numbered only where a call becomes an event: a handle seen on
    // skipped lines alone is no stream of the trace.
    const std::uint64_t handle = read_stream(field[5]);

    if (action == Action::kAllocateFailure) {
      ++log_.allocation_failures;
      return;
    }
    if (pointer == 0) {
      if (size != 0) {
        fail(std::string(action == Action::kAllocate ? "allocate" : "free") + " of " +
             std::to_string(size) + " bytes at a null pointer");
      }
      ++log_.null_zero_byte_events;
      return;
    }
    if (action == Action::kAllocate) {
      allocate(pointer, size, stream_number(handle));
    } else {
      deallocate(pointer, size, stream_number(handle));
    }
  }

  void allocate(std::uint64_t pointer, std::uint64_t size, std::uint64_t stream) {
    const auto [it, inserted] =
        live_.try_emplace(pointer, LiveAllocation{next_id_, size, lines_.number()});
    if (!inserted) {
      fail("allocate at pointer " + hex(pointer) + ", which is still live (allocated on line " +
           std::to_string(it->second.line) + " and not freed)");
    }
    log_.trace.events.push_back({TraceEvent::Op::kAlloc, next_id_, size, stream});
    ++next_id_;
  }

  void deallocate(std::uint64_t pointer, std::uint64_t size, std::uint64_t stream) {
    const auto it = live_.find(pointer);
    if (it == live_.end()) {
      const auto freed = freed_on_line_.find(pointer);
      fail("free of pointer " + hex(pointer) + ", which is not live (" +
           (freed == freed_on_line_.end() ? std::string("never allocated in this log")
                                          : "last freed on line " + std::to_string(freed->second)) +
           ")");
    }
    const LiveAllocation allocation = it->second;
    if (allocation.size != size) {
      fail("free of pointer " + hex(pointer) + " with size " + std::to_string(size) +
           ", but it was allocated with size " + std::to_string(allocation.size) + " on line " +
           std::to_string(allocation.line));
    }
    live_.erase(it);
    freed_on_line_[pointer] = lines_.number();
    log_.trace.events.push_back({TraceEvent::Op::kFree, allocation.id, size, stream});
  }

  Action read_action(std::string_view text) const {
    if (text == "allocate") return Action::kAllocate;
    if (text == "free" || text == "deallocate") return Action::kFree;
    if (text == "allocate failure") return Action::kAllocateFailure;
    fail("unknown action " + quoted(text) + " (expected 'allocate', 'free' or 'allocate failure')");
  }

  std::uint64_t read_pointer(std::string_view text) const {
    if (text == "(nil)") return 0;
    std::string_view digits = text;
    if (digits.size() > 2 && digits[0] == '0' && (digits[1] == 'x' || digits[1] == 'X')) {
      digits.remove_prefix(2);
    }
    std::uint64_t value = 0;
    const auto result = std::from_chars(digits.data(), digits.data() + digits.size(), value, 16);
    if (digits.empty() || result.ptr != digits.data() + digits.size() ||
        result.ec == std::errc::invalid_argument) {
      fail("pointer " + quoted(text) +
           " is not a hexadecimal address (expected e.g. '0x7f8a40000000' or '(nil)')");
    }
    if (result.ec != std::errc()) fail("pointer " + quoted(text) + " does not fit 64 bits");
    return value;
  }

  std::uint64_t read_stream(std::string_view text) const {
    if (text == "(nil)") return 0;
    if (text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) {
      const std::string_view digits = text.substr(2);
      std::uint64_t value = 0;
      const auto result = std::from_chars(digits.data(), digits.data() + digits.size(), value, 16);
      if (result.ptr != digits.data() + digits.size() || result.ec == std::errc::invalid_argument) {
        fail("stream " + quoted(text) + " is not a stream handle (hex '0x...' or decimal)");
      }
      if (result.ec != std::errc()) fail("stream " + quoted(text) + " does not fit 64 bits");
      return value;
    }
    return read_decimal("stream", text);
  }

  std::uint64_t read_decimal(const char* what, std::string_view text) const {
    std::uint64_t value = 0;
    std::string fault;
    if (!detail::parse_decimal_field(what, text, value, fault)) fail(fault);
    return value;
  }

  std::uint64_t stream_number(std::uint64_t handle) {
    const auto [it, inserted] = stream_numbers_.try_emplace(handle, log_.streams.size());
    if (inserted) log_.streams.push_back(handle);
    return it->second;
  }

  detail::TextLines& lines_;
  std::uint64_t next_id_ = 0;
  RmmLog log_;
  std::unordered_map<std::uint64_t, LiveAllocation> live_;
  std::unordered_map<std::uint64_t, std::size_t> freed_on_line_;
  std::unordered_map<std::uint64_t, std::uint64_t> stream_numbers_;
};

}  // namespace

RmmLog detail::parse_rmm_lines(TextLines& lines) { return RmmLogParser(lines).parse(); }

RmmLog parse_rmm_log(std::string_view text, std::string source_name, const TraceLimits& limits) {
  detail::TextLines lines(std::move(source_name), text, limits);
  return detail::parse_rmm_lines(lines);
}

RmmLog read_rmm_log(const std::string& path, const TraceLimits& limits) {
  detail::TextLines lines = detail::TextLines::open(path, limits);
  return detail::parse_rmm_lines(lines);
}

}  // namespace sdalloc
