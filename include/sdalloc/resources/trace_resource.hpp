// sdalloc/resources/trace_resource.hpp - records every allocation as an event trace.
//
// TraceResource forwards to an upstream resource and appends one line per event to a CSV
// in the event-trace format that `sdalloc replay` reads (docs/formats.md), written by
// EventTraceWriter (sdalloc/trace/event_trace_writer.hpp):
//     op,id,size,stream
//     a,0,4096,0         allocation of 4096 bytes on stream 0, given id 0
//     f,0,4096,0         its free
// Ids count up from 0 in allocation order. Failed allocations are not recorded (the trace
// describes what a program did, and a replay would fail at the same point anyway).
// Zero-byte requests and null frees are not events. Thread-safe: one mutex orders the
// lines, so the file is a valid sequential history of the calls. The output is flushed
// by flush() and on destruction. A deallocate of a pointer the trace never saw throws
// InvalidPointer and is not forwarded: the trace could not describe it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <unordered_map>

#include "sdalloc/core/resource.hpp"
#include "sdalloc/trace/event_trace_writer.hpp"

namespace sdalloc {

class TraceResource final : public MemoryResource {
 public:
  // Writes to a stream the caller owns and keeps alive.
  TraceResource(MemoryResource& upstream, std::ostream& out);
  // Creates (truncates) the file; throws InvalidArgument naming the path if it cannot.
  TraceResource(MemoryResource& upstream, const std::string& path);
  ~TraceResource() override;

  void flush();
  std::uint64_t events() const;  // lines written after the header

  std::size_t capacity() const override { return upstream_.capacity(); }
  std::string name() const override;
  MemoryResource& upstream() const { return upstream_; }

 private:
  void* do_allocate(std::size_t bytes, Stream stream) override;
  void do_deallocate(void* ptr, std::size_t bytes, Stream stream) override;

  MemoryResource& upstream_;
  std::unique_ptr<std::ofstream> file_;  // set when constructed from a path
  std::ostream& out_;
  EventTraceWriter writer_;  // writes the header when constructed
  mutable std::mutex mutex_;
  std::unordered_map<const void*, std::uint64_t> ids_;  // live pointer -> id
  std::uint64_t next_id_ = 0;
  std::uint64_t events_ = 0;
};

}  // namespace sdalloc
