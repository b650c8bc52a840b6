// sdalloc/trace/trace_text.hpp - the bytes of a trace file, plain or gzip, or standard input.
//
// Every trace reader (event traces, RMM logs) starts here, so they all accept the same
// inputs and report unreadable ones the same way: a TraceFormatError (declared here, below
// every format, so the byte reader needs no format's header) naming the file, with line 0 when it
// cannot be opened and the line reached when the gzip stream is truncated or corrupt (a cut-off
// file never reads as a shorter trace).
//
// The readers stream their input: a file is read and decompressed a chunk at a time, its format
// told from its first bytes, and no more than one line (and one chunk) is held at once. So a
// file that is no trace (/dev/zero, a gzip of zeros) fails at once, and TraceLimits bounds what
// a hostile one can cost: a line longer than max_line_bytes, or more than max_bytes of
// (decompressed) input, is a TraceFormatError naming the line reached.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "sdalloc/core/errors.hpp"

namespace sdalloc {

// A trace that cannot be read, in any format: the message is "<source>:<line>: <problem>",
// or "<source>: <problem>" for line 0 (the problem is not on one line, e.g. the file cannot
// be opened). An InvalidArgument, so callers that catch bad input catch it too. The message
// holds no control byte: input bytes in it are escaped as \xNN (a NUL would cut it short, a
// terminal escape code would reach the terminal); `source` keeps the name as given.
class TraceFormatError : public InvalidArgument {
 public:
  TraceFormatError(const std::string& source_name, std::size_t line_number,
                   const std::string& problem);
  std::string source;
  std::size_t line;
};

// Bounds on one trace input. The defaults are far beyond any real trace (whose lines are a
// few dozen bytes) and keep a hostile or mistaken input from exhausting memory.
struct TraceLimits {
  std::size_t max_line_bytes = std::size_t{1} << 20;  // 1 MiB
  std::uint64_t max_bytes = std::uint64_t{64} << 30;  // 64 GiB, after decompression
};

// The decompressed bytes of a file and the name errors use for it ("<stdin>" for "-").
struct TraceText {
  std::string source;
  std::string bytes;
};

// Reads a whole plain or gzip file (zlib tells them apart), at most limits.max_bytes; "-"
// reads standard input, which stays open for others. The trace readers do not use it: they
// stream.
TraceText read_trace_text(const std::string& path, const TraceLimits& limits = {});

}  // namespace sdalloc
