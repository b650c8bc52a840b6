// sdalloc/trace/trace_text.hpp - the bytes of a trace file, plain or gzip, or standard input.
//
// Every trace reader (event traces, RMM logs) starts here, so they all accept the same
// inputs and report unreadable ones the same way: a TraceFormatError (declared here, below
// every format, so the byte reader needs no format's header) naming the file, with line 0 when it
// cannot be opened and the line reached when the gzip stream is truncated or corrupt (a cut-off
// file never reads as a shorter trace).
#pragma once

#include <cstddef>
#include <string>

#include "sdalloc/core/errors.hpp"

namespace sdalloc {

// A trace that cannot be read, in any format: the message is "<source>:<line>: <problem>",
// or "<source>: <problem>" for line 0 (the problem is not on one line, e.g. the file cannot
// be opened). An InvalidArgument, so callers that catch bad input catch it too.
class TraceFormatError : public InvalidArgument {
 public:
  TraceFormatError(const std::string& source_name, std::size_t line_number,
                   const std::string& problem);
  std::string source;
  std::size_t line;
};

// The decompressed bytes of a file and the name errors use for it ("<stdin>" for "-").
struct TraceText {
  std::string source;
  std::string bytes;
};

// Reads a whole plain or gzip file (zlib tells them apart); "-" reads standard input,
// which stays open for others.
TraceText read_trace_text(const std::string& path);

}  // namespace sdalloc
