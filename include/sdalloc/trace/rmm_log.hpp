// sdalloc/trace/rmm_log.hpp - RMM's allocation log, read as an event trace.
//
// RAPIDS RMM's logging_resource_adaptor (C++ rmm::mr::logging_resource_adaptor, Python
// rmm.mr.LoggingResourceAdaptor) writes one CSV line per call to the resource it wraps:
//     Thread,Time,Action,Pointer,Size,Stream                      header, exactly this
//     140573312345856,14:05:12.123456,allocate,0x7f8a40000000,1024,0x5633a1e0
//     140573312345856,14:05:12.234567,free,0x7f8a40000000,1024,0x5633a1e0
//     140573312345856,14:05:12.345678,allocate failure,(nil),1099511627776,0
// The conversion to an event trace (event_trace.hpp):
//   allocate          -> `a` with a fresh id (0, 1, 2, ... in log order).
//   free              -> `f` of the id live at that pointer, with the allocation's size. A free
//                        of a pointer that is not live, or whose size differs from the
//                        allocation's, is an error. `deallocate` is read as `free` (RMM's user
//                        guide shows that word, though the adaptor writes `free`).
//   allocate failure  -> skipped (no memory changed hands) and counted in allocation_failures.
// An allocate or free of a null pointer with size 0 is skipped and counted in
// null_zero_byte_events: some resources answer a 0-byte request with no memory at all, so
// several such "allocations" share the null pointer. A null pointer with a nonzero size, or
// an allocate at a pointer that is still live, is an error.
//
// Fields: Thread and Time are not used (only their presence is checked). Pointer is hex as
// printf's %p writes it ("0x7f8a40000000", "(nil)" for null); bare hex digits are also read
// as hex, as RMM's own replay benchmark does. Size is a non-negative decimal integer. Stream
// is the CUDA stream handle, hex with 0x ("0x5633a1e0") or decimal ("0" = the default
// stream); handles are numbered 0, 1, 2, ... in order of first appearance on an allocate or
// free that becomes an event (so the first such stream is stream 0, whichever handle it is;
// a handle seen only on skipped lines is checked but not numbered), and `streams` keeps the
// handles.
//
// Errors are TraceFormatError "<source>:<line>: <what is wrong>" with the 1-based line, as
// for event traces; read_rmm_log takes plain or gzip files and "-" for standard input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sdalloc/trace/event_trace.hpp"

namespace sdalloc {

constexpr std::string_view kRmmLogHeader = "Thread,Time,Action,Pointer,Size,Stream";

struct RmmLog {
  EventTrace trace;
  std::size_t allocation_failures = 0;    // "allocate failure" lines, skipped
  std::size_t null_zero_byte_events = 0;  // allocate/free of (nil) with size 0, skipped
  std::vector<std::uint64_t> streams;     // streams[i]: the handle numbered i in the trace
};

// Parses a whole log held in memory; source_name names it in errors and in the trace.
RmmLog parse_rmm_log(std::string_view text, std::string source_name,
                     const TraceLimits& limits = {});
// Reads a plain or gzip file, streaming; "-" reads standard input.
RmmLog read_rmm_log(const std::string& path, const TraceLimits& limits = {});

}  // namespace sdalloc
