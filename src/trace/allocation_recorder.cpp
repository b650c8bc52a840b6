// allocation_recorder.cpp - AllocationRecorder: the event trace of a C API pool.
#include "trace/allocation_recorder.hpp"

#include <exception>
#include <ios>
#include <string>

#include "sdalloc/core/errors.hpp"

namespace sdalloc::detail {

void AllocationRecorder::start(const std::string& path) {
  std::lock_guard lock(mutex_);
  if (out_ != nullptr) {
    throw InvalidArgument("already recording to '" + path_ + "' (stop that trace first)");
  }
  auto out = std::make_unique<std::ofstream>(path, std::ios::out | std::ios::trunc);
  if (!*out) throw InvalidArgument("cannot create trace file '" + path + "'");
  auto writer = std::make_unique<EventTraceWriter>(*out);  // writes the header
  out_ = std::move(out);
  writer_ = std::move(writer);
  path_ = path;
  live_.clear();
  streams_.clear();
  streams_.emplace(kDefaultStream.handle, 0);
  next_id_ = 0;
  events_ = 0;
  lost_events_ = false;
  active_.store(true, std::memory_order_relaxed);
}

std::uint64_t AllocationRecorder::stop() {
  std::lock_guard lock(mutex_);
  if (out_ == nullptr) throw InvalidArgument("not recording (start a trace first)");
  active_.store(false, std::memory_order_relaxed);
  out_->flush();
  const bool failed = !*out_;
  writer_.reset();
  out_.reset();
  live_.clear();
  if (failed) throw Error("writing the trace file '" + path_ + "' failed (disk full?)");
  if (lost_events_) {
    throw Error("the trace '" + path_ + "' is incomplete: sdalloc ran out of host memory " +
                "for its bookkeeping while recording");
  }
  return events_;
}

std::uint64_t AllocationRecorder::stream_id(Stream stream) {
  const auto [it, inserted] = streams_.try_emplace(stream.handle, streams_.size());
  return it->second;
}

void AllocationRecorder::record_allocate(const void* ptr, std::size_t bytes,
                                         Stream stream) noexcept {
  std::lock_guard lock(mutex_);
  if (out_ == nullptr) return;  // stopped between the check and the lock
  try {
    const std::uint64_t id = next_id_++;
    live_.emplace(reinterpret_cast<std::uintptr_t>(ptr), Live{id, bytes});
    writer_->allocate(id, bytes, stream_id(stream));
    ++events_;
  } catch (const std::exception&) {
    lost_events_ = true;
  }
}

void AllocationRecorder::record_free(const void* ptr, Stream stream) noexcept {
  std::lock_guard lock(mutex_);
  if (out_ == nullptr) return;
  const auto found = live_.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (found == live_.end()) return;  // allocated before start(), or not ours: no event
  try {
    writer_->free(found->second.id, found->second.bytes, stream_id(stream));
    ++events_;
  } catch (const std::exception&) {
    lost_events_ = true;
  }
  live_.erase(found);
}

}  // namespace sdalloc::detail
