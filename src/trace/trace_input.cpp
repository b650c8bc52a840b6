// trace_input.cpp - reading any trace file: decompress, recognise the format, convert.
//
// The file is streamed (text_lines.hpp; zlib's gz* functions pass plain files through
// unchanged): the format is told from its first bytes, then the same stream is parsed on, so
// standard input is read once and a file that is no trace (/dev/zero, a gzip of zeros) fails
// before the rest of it is read.
#include "sdalloc/trace/trace_input.hpp"

#include <algorithm>
#include <array>
#include <sstream>
#include <utility>

#include "sdalloc/trace/event_trace_writer.hpp"
#include "sdalloc/trace/rmm_log.hpp"

#include "trace/quoted.hpp"
#include "trace/text_lines.hpp"
#include "trace/trace_parsers.hpp"

namespace sdalloc {
namespace {

constexpr std::string_view kConverter = "tools/torch_snapshot_to_trace.py";
constexpr std::size_t kFormatBytes = 4096;  // every header is one short line

std::string_view first_line(std::string_view bytes) {
  std::string_view line = bytes.substr(0, bytes.find('\n'));
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  constexpr std::size_t kShown = 80;  // a binary file's "line" can be megabytes
  if (line.size() > kShown) line = line.substr(0, kShown);
  return line;
}

bool printable(std::string_view text) {
  return std::all_of(text.begin(), text.end(), [](char c) {
    const auto byte = static_cast<unsigned char>(c);
    return byte >= 0x20 && byte < 0x7f;
  });
}

}  // namespace

const char* trace_format_name(TraceFormat format) {
  return format == TraceFormat::kEventTrace ? "event trace" : "RMM log";
}

TraceFormat detect_trace_format(std::string_view bytes, const std::string& source) {
  if (bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x80 && bytes[1] >= 2 &&
      bytes[1] <= 5) {
    throw TraceFormatError(
        source, 1,
        "this is a Python pickle, probably a PyTorch memory snapshot "
        "(torch.cuda.memory._dump_snapshot): convert it to an event trace first with "
        "'python3 " +
            std::string(kConverter) + " SNAPSHOT -o TRACE.csv'");
  }
  if (bytes.substr(0, 4) == std::string_view("PK\x03\x04", 4)) {
    throw TraceFormatError(source, 1,
                           "this is a zip archive (e.g. torch.save output), not a trace; for a "
                           "PyTorch memory snapshot use torch.cuda.memory._dump_snapshot and "
                           "convert it with " +
                               std::string(kConverter));
  }
  if (bytes.empty()) {
    throw TraceFormatError(source, 1,
                           "empty file: expected an event trace (header 'op,id,size' or "
                           "'op,id,size,stream') or an RMM log (header '" +
                               std::string(kRmmLogHeader) + "')");
  }
  const std::string_view line = first_line(bytes);
  if (event_trace_header_fields(line) != 0) return TraceFormat::kEventTrace;
  if (line == kRmmLogHeader) return TraceFormat::kRmmLog;
  const std::string shown = printable(line) ? detail::quoted(line) : "binary data";
  throw TraceFormatError(source, 1,
                         "unrecognised trace format: first line is " + shown +
                             "; expected an event trace header ('op,id,size' or "
                             "'op,id,size,stream') or an RMM log header ('" +
                             std::string(kRmmLogHeader) + "')");
}

TraceInput read_trace_input(const std::string& path, const TraceLimits& limits) {
  detail::TextLines lines = detail::TextLines::open(path, limits);
  const TraceFormat format = detect_trace_format(lines.peek(kFormatBytes), lines.source());
  if (format == TraceFormat::kEventTrace) {
    return TraceInput{detail::parse_event_lines(lines), format, {}};
  }
  RmmLog log = detail::parse_rmm_lines(lines);
  TraceInput input{std::move(log.trace), format, {}};
  if (log.allocation_failures != 0) {
    input.notes.push_back(std::to_string(log.allocation_failures) +
                          " 'allocate failure' line(s) skipped: those calls got no memory");
  }
  if (log.null_zero_byte_events != 0) {
    input.notes.push_back(std::to_string(log.null_zero_byte_events) +
                          " allocate/free call(s) of 0 bytes at a null pointer skipped");
  }
  if (log.streams.size() > 1) {
    std::string mapping = "streams numbered in order of first appearance:";
    for (std::size_t i = 0; i < log.streams.size(); ++i) {
      std::ostringstream handle;
      handle << std::hex << log.streams[i];
      mapping += (i == 0 ? " " : ", ") + std::to_string(i) + " = 0x" + handle.str();
    }
    input.notes.push_back(mapping);
  }
  return input;
}

EventTrace read_any_trace(const std::string& path, const TraceLimits& limits) {
  return read_trace_input(path, limits).trace;
}

}  // namespace sdalloc
