// sdalloc/trace/trace_input.hpp - one entry point for every allocation-trace format sdalloc reads.
//
// read_any_trace(path) reads a file ("-": standard input), plain or gzip-compressed, and
// picks the reader from the content, never from the file name:
//   first line `op,id,size` or `op,id,size,stream`  -> event trace (event_trace.hpp)
//   first line `Thread,Time,Action,Pointer,Size,Stream` -> RMM log (rmm_log.hpp)
//   a pickle (bytes 0x80 then protocol 2-5)        -> rejected: a PyTorch memory snapshot
//       (torch.cuda.memory._dump_snapshot) must first be converted with
//       tools/torch_snapshot_to_trace.py. The C++ side never unpickles: that needs Python,
//       and unpickling untrusted data can run arbitrary code.
//   a zip archive (bytes "PK\3\4")                 -> rejected: torch.save() output, not a trace
//   anything else                                  -> rejected, naming the first line found
// Every problem is a TraceFormatError "<source>:<line>: <what is wrong>" (line 0 when the
// file cannot be opened); a truncated gzip file is an error, never a shorter trace; a line or
// an input beyond TraceLimits is an error naming the line reached.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "sdalloc/trace/event_trace.hpp"
#include "sdalloc/trace/trace_text.hpp"

namespace sdalloc {

enum class TraceFormat { kEventTrace, kRmmLog };

// "event trace" or "RMM log", for messages.
const char* trace_format_name(TraceFormat format);

struct TraceInput {
  EventTrace trace;
  TraceFormat format;
  // What the conversion skipped, one sentence each, for the user (empty for event traces).
  std::vector<std::string> notes;
};

// Which reader the bytes need, told from the first line (the first few KiB are enough); throws the
// TraceFormatError described above when none does.
TraceFormat detect_trace_format(std::string_view bytes, const std::string& source);

// Reads and converts, streaming within `limits` (trace_text.hpp), keeping what the
// conversion reports. The format is told from the first bytes, before the rest is read.
TraceInput read_trace_input(const std::string& path, const TraceLimits& limits = {});
// Reads and converts; read_trace_input(path, limits).trace.
EventTrace read_any_trace(const std::string& path, const TraceLimits& limits = {});

}  // namespace sdalloc
