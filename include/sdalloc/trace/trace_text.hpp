// sdalloc/trace/trace_text.hpp - the bytes of a trace file, plain or gzip, or standard input.
//
// Every trace reader (event traces, RMM logs) starts here, so they all accept the same
// inputs and report unreadable ones the same way: a TraceFormatError (event_trace.hpp)
// naming the file, with line 0 when it cannot be opened and the line reached when the
// gzip stream is truncated or corrupt (a cut-off file never reads as a shorter trace).
#pragma once

#include <string>

namespace sdalloc {

// The decompressed bytes of a file and the name errors use for it ("<stdin>" for "-").
struct TraceText {
  std::string source;
  std::string bytes;
};

// Reads a whole plain or gzip file (zlib tells them apart); "-" reads standard input,
// which stays open for others.
TraceText read_trace_text(const std::string& path);

}  // namespace sdalloc
