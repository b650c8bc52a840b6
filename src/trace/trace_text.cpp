// trace_text.cpp - TraceFormatError, the error every trace reader throws, and reading a whole
// trace file (the byte sources are in text_lines.cpp).
#include "sdalloc/trace/trace_text.hpp"

#include <algorithm>
#include <memory>
#include <string>

#include "trace/quoted.hpp"
#include "trace/text_lines.hpp"

namespace sdalloc {
namespace {

// The message, escaped whole: the parsers escape the input they quote already (escaping is
// idempotent), and this catches the rest, e.g. a file name holding a control byte.
std::string message(const std::string& source, std::size_t line, const std::string& problem) {
  const std::string where = detail::escaped(source, detail::kUnlimited);
  const std::string what = detail::escaped(problem, detail::kUnlimited);
  return line == 0 ? where + ": " + what : where + ":" + std::to_string(line) + ": " + what;
}

}  // namespace

TraceFormatError::TraceFormatError(const std::string& source_name, std::size_t line_number,
                                   const std::string& problem)
    : InvalidArgument(message(source_name, line_number, problem)),
      source(source_name),
      line(line_number) {}

TraceText read_trace_text(const std::string& path, const TraceLimits& limits) {
  TraceText text;
  const std::unique_ptr<detail::ByteSource> bytes = detail::open_byte_source(path, text.source);
  constexpr std::size_t kChunk = std::size_t{1} << 18;
  std::string problem;
  for (;;) {
    const std::size_t start = text.bytes.size();
    text.bytes.resize(start + kChunk);
    const std::size_t n = bytes->read(text.bytes.data() + start, kChunk, problem);
    text.bytes.resize(start + n);
    const auto line = [&] {
      return static_cast<std::size_t>(std::count(text.bytes.begin(), text.bytes.end(), '\n')) + 1;
    };
    if (!problem.empty()) throw TraceFormatError(text.source, line(), problem);
    if (n == 0) return text;
    if (text.bytes.size() > limits.max_bytes) {
      throw TraceFormatError(text.source, line(),
                             "the input is longer than " + std::to_string(limits.max_bytes) +
                                 " bytes, the limit for one trace (TraceLimits::max_bytes)");
    }
  }
}

}  // namespace sdalloc
