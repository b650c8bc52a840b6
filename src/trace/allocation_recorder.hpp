// allocation_recorder.hpp - writes what a C API pool serves as an event trace, on demand.
//
// A pool handle (c_pool.hpp) owns one AllocationRecorder, off until start(path). While it is
// on, each successful allocation and each free of a pointer allocated while it was on become
// one line of the event trace format (event_trace.hpp, docs/formats.md), written by
// EventTraceWriter (event_trace_writer.hpp):
//     op,id,size,stream
//     a,0,4096,0
//     f,0,4096,0
// Ids count from 0 in allocation order; a free repeats its allocation's requested size.
// Streams are numbered in order of first appearance, the default stream being 0, so the
// trace replays with `sdalloc replay` whatever the native handles were. Allocations made
// before start() are not in the trace and neither are their frees, so every trace is valid
// on its own; allocations still live at stop() stay open in the trace, which the format
// allows.
//
// Ordering: the caller reports a free BEFORE the pool frees the memory (on_free), and an
// allocation after the pool returned it (on_allocate). So a line for an address is always
// written before another thread can be handed the same address again.
//
// Thread-safety: every member may be called concurrently. When off, on_allocate and on_free
// cost one relaxed atomic load; when on, they take one mutex.
// Errors: start() throws InvalidArgument if already on or if the file cannot be created;
// stop() throws InvalidArgument if not on and Error if writing failed (disk full): the
// message names the path. on_allocate / on_free never throw: a failure to record (no
// memory for the bookkeeping) is remembered and reported by stop().
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "sdalloc/core/stream.hpp"
#include "sdalloc/trace/event_trace_writer.hpp"

namespace sdalloc::detail {

class AllocationRecorder {
 public:
  void start(const std::string& path);
  // Flushes and closes the file; answers the number of events written.
  std::uint64_t stop();
  bool active() const { return active_.load(std::memory_order_relaxed); }

  void on_allocate(const void* ptr, std::size_t bytes, Stream stream) noexcept {
    if (active() && ptr != nullptr) record_allocate(ptr, bytes, stream);
  }
  void on_free(const void* ptr, Stream stream) noexcept {
    if (active() && ptr != nullptr) record_free(ptr, stream);
  }

 private:
  struct Live {
    std::uint64_t id;
    std::size_t bytes;
  };

  void record_allocate(const void* ptr, std::size_t bytes, Stream stream) noexcept;
  void record_free(const void* ptr, Stream stream) noexcept;
  std::uint64_t stream_id(Stream stream);  // under mutex_

  std::atomic<bool> active_{false};
  std::mutex mutex_;
  std::string path_;
  std::unique_ptr<std::ofstream> out_;
  std::unique_ptr<EventTraceWriter> writer_;  // writes to *out_ while recording
  std::unordered_map<std::uintptr_t, Live> live_;
  std::unordered_map<std::uintptr_t, std::uint64_t> streams_;
  std::uint64_t next_id_ = 0;
  std::uint64_t events_ = 0;
  bool lost_events_ = false;
};

}  // namespace sdalloc::detail
