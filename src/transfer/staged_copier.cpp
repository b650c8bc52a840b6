// staged_copier.cpp - page-locked staging chunks and the thread that fills them in order.
#include "transfer/staged_copier.hpp"

#include <algorithm>
#include <cstring>

namespace sdalloc::transfer_detail {

StagedCopier::StagedCopier(StreamDevice& device, std::size_t chunk_bytes, std::size_t chunks)
    : device_(device), chunk_bytes_(chunk_bytes) {
  if (chunk_bytes_ == 0 || chunks == 0) {
    throw InvalidArgument("StagedCopier: staging needs at least one chunk of some bytes");
  }
  try {
    for (std::size_t i = 0; i < chunks; ++i) {
      chunks_.push_back(static_cast<std::byte*>(device_.allocate_pinned(chunk_bytes_)));
      chunk_done_.push_back(device_.create_event(false));
      chunk_used_.push_back(false);
    }
  } catch (const std::exception& error) {
    for (std::byte* c : chunks_) device_.free_pinned(c, chunk_bytes_);
    throw RegistrationRefused(std::string("no page-locked staging for the copies the arena's "
                                          "registration left (") +
                              error.what() + ")");
  }
  worker_ = std::thread([this] { run(); });
}

StagedCopier::~StagedCopier() {
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  worker_.join();
  try {
    device_.synchronize(DeviceQueue::kCopy);  // no chunk may be freed under a copy
  } catch (const std::exception&) {           // nothing to report to from a destructor
  }
  for (std::byte* c : chunks_) {
    try {
      device_.free_pinned(c, chunk_bytes_);
    } catch (const std::exception&) {
    }
  }
}

void StagedCopier::stage(void* dst, const void* src, std::size_t bytes) {
  for (std::size_t off = 0; off < bytes; off += chunk_bytes_) {
    const std::size_t n = std::min(chunk_bytes_, bytes - off);
    const std::size_t k = next_chunk_++ % chunks_.size();
    if (chunk_used_[k]) device_.wait_host(chunk_done_[k]);  // its last copy has read it
    std::memcpy(chunks_[k], static_cast<const std::byte*>(src) + off, n);
    device_.copy_to_device(static_cast<std::byte*>(dst) + off, chunks_[k], n);
    device_.record(chunk_done_[k], DeviceQueue::kCopy);
    chunk_used_[k] = true;
  }
}

void StagedCopier::copy_now(void* dst, const void* src, std::size_t bytes) {
  stage(dst, src, bytes);
  const std::lock_guard lock(mutex_);
  ++staged_;
}

std::uint64_t StagedCopier::post(const StagedJob& job) {
  const std::lock_guard lock(mutex_);
  if (error_) std::rethrow_exception(error_);
  jobs_.push_back(job);
  changed_.notify_all();
  return ++posted_;
}

void StagedCopier::wait_posted(std::uint64_t ticket) {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return queued_ >= ticket || error_; });
  if (error_) std::rethrow_exception(error_);
}

void StagedCopier::drain() {
  std::uint64_t last = 0;
  {
    const std::lock_guard lock(mutex_);
    last = posted_;
  }
  wait_posted(last);
}

std::uint64_t StagedCopier::staged_copies() const {
  const std::lock_guard lock(mutex_);
  return staged_;
}

void StagedCopier::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
    if (jobs_.empty()) return;
    const StagedJob job = jobs_.front();
    jobs_.pop_front();
    lock.unlock();
    try {
      if (job.after) device_.wait(DeviceQueue::kCopy, *job.after);
      if (job.pinned) {
        device_.copy_to_device(job.dst, job.src, job.bytes);
      } else {
        stage(job.dst, job.src, job.bytes);
      }
      device_.record(job.done, DeviceQueue::kCopy);
      lock.lock();
      staged_ += job.pinned ? 0 : 1;
    } catch (...) {
      lock.lock();
      error_ = std::current_exception();
    }
    ++queued_;
    changed_.notify_all();
  }
}

}  // namespace sdalloc::transfer_detail
