// trace_resource.cpp - writes each allocation and free as a line of an event trace.
//
// Line order must be a valid history: an address can be handed out again only after its
// free, so the free line is written (and the pointer forgotten) before the memory goes back
// upstream, and the alloc line after the memory came from upstream. Upstream calls happen
// outside the mutex, which only orders the lines and guards the pointer table.
#include "sdalloc/resources/trace_resource.hpp"

#include "sdalloc/core/errors.hpp"

namespace sdalloc {

TraceResource::TraceResource(MemoryResource& upstream, std::ostream& out)
    : upstream_(upstream), out_(out), writer_(out_) {}

TraceResource::TraceResource(MemoryResource& upstream, const std::string& path)
    : upstream_(upstream),
      file_(std::make_unique<std::ofstream>(path, std::ios::out | std::ios::trunc)),
      out_(*file_),
      writer_(out_) {
  if (!file_->is_open()) {
    throw InvalidArgument("TraceResource: cannot create trace file '" + path + "'");
  }
}

TraceResource::~TraceResource() {
  try {
    flush();
  } catch (...) {  // a destructor must not throw; the stream keeps its error state
  }
}

void TraceResource::flush() {
  std::lock_guard<std::mutex> lock(mutex_);
  out_.flush();
}

std::uint64_t TraceResource::events() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return events_;
}

std::string TraceResource::name() const { return "trace(" + upstream_.name() + ")"; }

void* TraceResource::do_allocate(std::size_t bytes, Stream stream) {
  if (bytes == 0) return nullptr;
  void* ptr = upstream_.allocate(bytes, stream);
  std::lock_guard<std::mutex> lock(mutex_);
  const std::uint64_t id = next_id_++;
  ids_[ptr] = id;
  writer_.allocate(id, bytes, stream.handle);
  ++events_;
  return ptr;
}

void TraceResource::do_deallocate(void* ptr, std::size_t bytes, Stream stream) {
  if (ptr == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = ids_.find(ptr);
    if (it == ids_.end()) {
      throw InvalidPointer(
          "TraceResource: deallocate of a pointer that is not a live "
          "allocation of this trace",
          ptr);
    }
    writer_.free(it->second, bytes, stream.handle);
    ids_.erase(it);
    ++events_;
  }
  upstream_.deallocate(ptr, bytes, stream);
}

}  // namespace sdalloc
