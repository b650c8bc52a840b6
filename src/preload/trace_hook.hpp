// trace_hook.hpp - the drop-in's one door to the event-trace writer (record:PATH).
//
// The drop-in writes what its pool served in the event trace format (docs/formats.md), so a
// user's own run becomes a trace for `sdalloc replay`. Every use of the trace layer goes
// through these four functions, so a change to the writer (a rename, a new interface) touches
// this file only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "trace/allocation_recorder.hpp"

namespace sdalloc::preload {

using TraceWriter = detail::AllocationRecorder;

// Throws InvalidArgument when the file cannot be created.
inline void trace_start(TraceWriter& writer, const std::string& path) { writer.start(path); }
inline void trace_allocation(TraceWriter& writer, const void* ptr, std::size_t bytes) noexcept {
  writer.on_allocate(ptr, bytes, kDefaultStream);
}
// Before the pool frees ptr (so the line is written before the address can be reused).
inline void trace_free(TraceWriter& writer, const void* ptr) noexcept {
  writer.on_free(ptr, kDefaultStream);
}
// Answers the events written; throws Error when writing failed.
inline std::uint64_t trace_stop(TraceWriter& writer) { return writer.stop(); }

}  // namespace sdalloc::preload
