// host_copy_backend.cpp - copy streams as worker threads; memcpy, then sleep out the speed.
#include "sdalloc/transfer/host_copy_backend.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <string>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/transfer/transfer_handle.hpp"

namespace sdalloc {

struct HostCopyBackend::Fence final : CopyFence {
  std::atomic<bool> done{false};
  bool completed() const override { return done.load(std::memory_order_acquire); }
};

HostCopyBackend::HostCopyBackend(HostCopyBackendOptions options) : options_(std::move(options)) {
  if (options_.copy_streams == 0) {
    throw InvalidArgument("HostCopyBackend: copy_streams is 0; need at least one copy stream");
  }
  if (options_.bytes_per_second < 0) {
    throw InvalidArgument("HostCopyBackend: bytes_per_second is negative");
  }
  for (std::size_t i = 0; i < options_.copy_streams; ++i) {
    workers_.push_back(std::make_unique<Worker>());
  }
  for (std::size_t i = 0; i < workers_.size(); ++i) {
    workers_[i]->thread = std::thread([this, i] { run(i); });
  }
}

HostCopyBackend::~HostCopyBackend() {
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& worker : workers_) worker->thread.join();
}

std::string HostCopyBackend::name() const { return "host_copy"; }

std::shared_ptr<CopyFence> HostCopyBackend::submit(CopyCall call, std::size_t copy_stream) {
  auto fence = std::make_shared<Fence>();
  {
    const std::lock_guard lock(mutex_);
    if (stopping_) throw TransferError("HostCopyBackend: submit after shutdown began");
    ++calls_;
    ++outstanding_;
    workers_[copy_stream % workers_.size()]->jobs.push_back(Job{std::move(call), fence});
  }
  wake_.notify_all();
  return fence;
}

void HostCopyBackend::run(std::size_t index) {
  Worker& worker = *workers_[index];
  for (;;) {
    Job job;
    {
      std::unique_lock lock(mutex_);
      // On shutdown the queue is drained first: every call's `done` runs exactly once.
      wake_.wait(lock, [&] { return stopping_ || !worker.jobs.empty(); });
      if (worker.jobs.empty()) return;
      job = std::move(worker.jobs.front());
      worker.jobs.pop_front();
    }
    const auto start = std::chrono::steady_clock::now();
    std::exception_ptr error;
    std::size_t bytes = 0;
    if (options_.fail_call && options_.fail_call(job.call)) {
      error = std::make_exception_ptr(TransferError(
          "host copy backend: the " + std::string(to_string(job.call.kind)) + " call of " +
          std::to_string(job.call.regions.size()) + " region(s) failed (fail_call)"));
    } else {
      for (const CopyRegion& r : job.call.regions) {
        std::memcpy(r.dst, r.src, r.bytes);
        bytes += r.bytes;
      }
      if (options_.bytes_per_second > 0) {
        const auto lasts =
            std::chrono::duration<double>(static_cast<double>(bytes) / options_.bytes_per_second);
        std::this_thread::sleep_until(
            start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(lasts));
      }
    }
    if (job.call.done) job.call.done(error);
    job.fence->done.store(true, std::memory_order_release);
    {
      const std::lock_guard lock(mutex_);
      bytes_ += bytes;
      --outstanding_;
    }
    idle_.notify_all();
  }
}

void HostCopyBackend::synchronize() {
  std::unique_lock lock(mutex_);
  idle_.wait(lock, [&] { return outstanding_ == 0; });
}

void HostCopyBackend::stream_wait(const CopyFence& fence, Stream /*compute_stream*/) {
  // Host compute runs on the calling thread: "the stream waits" means this thread waits.
  std::unique_lock lock(mutex_);
  idle_.wait(lock, [&] { return fence.completed(); });
}

void HostCopyBackend::register_host(void* ptr, std::size_t bytes) {
  if (ptr == nullptr || bytes == 0) {
    throw InvalidArgument("HostCopyBackend: cannot register " + std::to_string(bytes) +
                          " bytes at a null pointer or an empty range");
  }
  const std::lock_guard lock(mutex_);
  registrations_.emplace_back(ptr, bytes);
  registered_ += bytes;
}

void HostCopyBackend::unregister_host(void* ptr) {
  const std::lock_guard lock(mutex_);
  const auto it = std::find_if(registrations_.begin(), registrations_.end(),
                               [&](const auto& r) { return r.first == ptr; });
  if (it == registrations_.end()) {
    throw InvalidPointer("HostCopyBackend: unregister of memory that is not registered", ptr);
  }
  registered_ -= it->second;
  registrations_.erase(it);
}

MappedBuffer HostCopyBackend::map_host(std::size_t bytes) {
  // The "device" addresses host memory directly: one pointer serves both sides.
  void* ptr = pinned_.allocate(bytes);
  return MappedBuffer{ptr, ptr, bytes};
}

void HostCopyBackend::unmap_host(const MappedBuffer& buffer) {
  pinned_.deallocate(buffer.host, buffer.bytes);
}

std::uint64_t HostCopyBackend::calls() const {
  const std::lock_guard lock(mutex_);
  return calls_;
}

std::uint64_t HostCopyBackend::bytes_copied() const {
  const std::lock_guard lock(mutex_);
  return bytes_;
}

std::uint64_t HostCopyBackend::registered_bytes() const {
  const std::lock_guard lock(mutex_);
  return registered_;
}

}  // namespace sdalloc
