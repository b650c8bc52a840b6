// trace_resource.cpp - writes each allocation and free as a line of an event trace.
//
// Line order must be a valid history: an address can be handed out again only after its
// free, so the free line is written (and the pointer forgotten) before the memory goes back
// upstream, and the alloc line after the memory came from upstream. Upstream calls happen
// outside the mutex, which only orders the lines and guards the pointer table.
#include "sdalloc/resources/trace_resource.hpp"

#include "sdalloc/core/errors.hpp"

namespace sdalloc {
namespace {

constexpr const char* kHeader = "op,id,size,stream\n";

}  // namespace

TraceResource::TraceResource(MemoryResource& upstream, std::ostream& out)
    : upstream_(upstream), out_(out) {
  out_ << kHeader;
}

TraceResource::TraceResource(MemoryResource& upstream, const std::string& path)
    : upstream_(upstream),
      file_(std::make_unique<std::ofstream>(path, std::ios::out | std::ios::trunc)),
      out_(*file_) {
  if (!file_->is_open()) {
    throw InvalidArgument("TraceResource: cannot create trace file '" + path + "'");
  }
  out_ << kHeader;
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
  out_ << "a," << id << ',' << bytes << ',' << stream.handle << '\n';
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
    out_ << "f," << it->second << ',' << bytes << ',' << stream.handle << '\n';
    ids_.erase(it);
    ++events_;
  }
  upstream_.deallocate(ptr, bytes, stream);
}

}  // namespace sdalloc
