// staged_copier.hpp - the unit offloader's copies when part of the host arena could not
// be page-locked (internal; the documented fallback of unit_offloader.hpp).
//
// A device copies pageable memory only by blocking the host; this never asks it to. A
// source that is not locked goes through a few page-locked staging chunks of its own: the
// bytes are memcpy'd into a chunk on the host, the chunk is copied to the device, and a
// chunk is refilled only after its last copy completed (a host wait, on this class's
// thread). So that the copy queue keeps the plan's order, every copy of a planned step
// goes through the one thread once a fallback exists (post, in order; the offloader waits
// with wait_posted only for a copy's *queuing*, never for the device).
//
// copy_now does one copy on the calling thread (set-up, recording, on-demand steps),
// with the thread idle (drain() first).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "sdalloc/transfer/stream_device.hpp"

namespace sdalloc::transfer_detail {

struct StagedJob {
  void* dst = nullptr;
  const void* src = nullptr;
  std::size_t bytes = 0;
  bool pinned = false;                       // the source is locked: one direct copy call
  std::optional<StreamDevice::Event> after;  // the copy queue waits for it first
  StreamDevice::Event done = 0;              // recorded on the copy queue after the copy
};

class StagedCopier {
 public:
  StagedCopier(StreamDevice& device, std::size_t chunk_bytes, std::size_t chunks = 2);
  StagedCopier(const StagedCopier&) = delete;
  StagedCopier& operator=(const StagedCopier&) = delete;
  ~StagedCopier();

  // Queues the copy of `bytes` from unlocked `src` on the copy queue, on this thread.
  void copy_now(void* dst, const void* src, std::size_t bytes);
  std::uint64_t post(const StagedJob& job);  // its ticket, 1, 2, ...
  void wait_posted(std::uint64_t ticket);
  void drain();
  std::uint64_t staged_copies() const;  // copies that went through staging

 private:
  void run();
  void stage(void* dst, const void* src, std::size_t bytes);

  StreamDevice& device_;
  std::size_t chunk_bytes_;
  std::vector<std::byte*> chunks_;
  std::vector<StreamDevice::Event> chunk_done_;
  std::vector<bool> chunk_used_;
  std::size_t next_chunk_ = 0;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<StagedJob> jobs_;
  std::uint64_t posted_ = 0;
  std::uint64_t queued_ = 0;
  std::uint64_t staged_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
  std::thread worker_;
};

}  // namespace sdalloc::transfer_detail
