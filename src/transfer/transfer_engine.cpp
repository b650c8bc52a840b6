// transfer_engine.cpp - the request queue, packing into staging, chunking, pinned ranges.
#include "sdalloc/transfer/transfer_engine.hpp"

#include <algorithm>
#include <cstring>
#include <utility>

#include "core/bits.hpp"
#include "sdalloc/core/errors.hpp"
#include "transfer/engine_core.hpp"

namespace sdalloc {

const char* to_string(CopyKind kind) {
  switch (kind) {
    case CopyKind::kHostToDevice:
      return "host->device";
    case CopyKind::kDeviceToHost:
      return "device->host";
    case CopyKind::kDeviceToDevice:
      return "device->device";
  }
  return "unknown";
}

namespace transfer_detail {

namespace {

void check_options(const TransferEngineOptions& o) {
  const auto need = [](bool ok, const std::string& what) {
    if (!ok) throw InvalidArgument("TransferEngine: " + what);
  };
  need(o.batch_bytes > 0 && o.chunk_bytes > 0 && o.register_chunk_bytes > 0,
       "batch_bytes, chunk_bytes and register_chunk_bytes must be positive");
  need(o.small_bytes <= o.batch_bytes, "small_bytes (" + format_size(o.small_bytes) +
                                           ") must not exceed batch_bytes (" +
                                           format_size(o.batch_bytes) + ")");
  need(o.staging_budget >= std::max(o.batch_bytes, o.chunk_bytes),
       "staging_budget (" + format_size(o.staging_budget) +
           ") must hold at least one batch and one chunk (" +
           format_size(std::max(o.batch_bytes, o.chunk_bytes)) + ")");
}

const void* host_side(CopyKind kind, const void* dst, const void* src) {
  switch (kind) {
    case CopyKind::kHostToDevice:
      return src;
    case CopyKind::kDeviceToHost:
      return dst;
    case CopyKind::kDeviceToDevice:
      return nullptr;
  }
  return nullptr;
}

}  // namespace

EngineCore::EngineCore(CopyBackend& backend, TransferEngineOptions options)
    : backend_(backend),
      options_((check_options(options), options)),
      staging_(backend.pinned_host(),
               StagingPoolOptions{options.staging_budget, StagingPoolOptions::WhenFull::kWait,
                                  std::chrono::milliseconds(60000)}) {}

EngineCore::~EngineCore() {
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  register_wake_.notify_all();
  if (registrar_.joinable()) registrar_.join();
  for (const auto& [base, chunks] : registrations_) {
    for (const std::uintptr_t chunk : chunks) {
      try {
        backend_.unregister_host(reinterpret_cast<void*>(chunk));
      } catch (const std::exception&) {  // nothing to report to from a destructor
      }
    }
  }
}

std::size_t EngineCore::stream_of(CopyKind kind) const {
  return kind == CopyKind::kDeviceToHost ? 1 % backend_.copy_streams() : 0;
}

TransferHandle EngineCore::copy(CopyKind kind, void* dst, const void* src, std::size_t bytes) {
  if (kind != CopyKind::kHostToDevice && kind != CopyKind::kDeviceToHost &&
      kind != CopyKind::kDeviceToDevice) {
    throw InvalidArgument("TransferEngine::copy: unknown copy kind");
  }
  if (bytes == 0) return {};
  if (dst == nullptr || src == nullptr) {
    throw InvalidArgument(std::string("TransferEngine::copy: a ") + to_string(kind) + " copy of " +
                          format_bytes(bytes) + " has a null " +
                          (dst == nullptr ? "destination" : "source"));
  }
  if (const void* host = host_side(kind, dst, src);
      host != nullptr && staging_.state_of(host) == StagingPool::BlockState::kFreed) {
    throw InvalidPointer(std::string("TransferEngine::copy: the host side of a ") +
                             to_string(kind) + " copy lies in a staging block that was freed " +
                             "(a copy from or into freed memory)",
                         host);
  }
  auto status = std::make_shared<RequestStatus>();
  status->core = weak_from_this();
  bool full = false;
  {
    const std::lock_guard lock(mutex_);
    queue_.push_back(Request{kind, dst, src, bytes, status});
    queued_bytes_ += bytes;
    ++stats_.requests;
    stats_.bytes += bytes;
    full = queued_bytes_ >= options_.batch_bytes;
  }
  if (full) flush();
  return TransferHandle(std::move(status));
}

std::vector<Request> EngineCore::claim(std::vector<Request> requests) {
  std::vector<Request> claimed;
  claimed.reserve(requests.size());
  for (Request& r : requests) {
    const std::lock_guard lock(r.status->mutex);
    if (r.status->state != TransferState::kQueued) continue;  // cancelled meanwhile
    r.status->state = TransferState::kSubmitted;
    claimed.push_back(std::move(r));
  }
  return claimed;
}

void EngineCore::submit(CopyCall call, std::size_t copy_stream,
                        const std::vector<Request>& requests) {
  {
    const std::lock_guard lock(mutex_);
    ++stats_.calls;
  }
  auto fence = backend_.submit(std::move(call), copy_stream);
  for (const Request& r : requests) {
    {
      const std::lock_guard lock(r.status->mutex);
      r.status->fence = fence;
    }
    r.status->changed.notify_all();  // stream_wait may be waiting for the fence
  }
}

void EngineCore::flush() {
  const std::lock_guard flushing(flush_mutex_);
  std::vector<Request> taken;
  {
    const std::lock_guard lock(mutex_);
    taken.swap(queue_);
    queued_bytes_ = 0;
  }
  taken = claim(std::move(taken));
  // One packing group per kind, each up to batch_bytes; large requests go on their own.
  std::vector<Request> groups[3];
  std::size_t group_bytes[3] = {0, 0, 0};
  const auto close_group = [&](std::size_t k) {
    if (groups[k].empty()) return;
    flush_packed(static_cast<CopyKind>(k), std::exchange(groups[k], {}));
    group_bytes[k] = 0;
  };
  for (Request& r : taken) {
    if (r.bytes > options_.small_bytes) {
      flush_large(r);
      continue;
    }
    const auto k = static_cast<std::size_t>(r.kind);
    const std::size_t size = round_up(r.bytes, kMinAlignment);
    if (group_bytes[k] + size > options_.batch_bytes) close_group(k);
    group_bytes[k] += size;
    groups[k].push_back(std::move(r));
  }
  for (std::size_t k = 0; k < 3; ++k) close_group(k);
}

void EngineCore::flush_packed(CopyKind kind, const std::vector<Request>& group) {
  try {
    CopyCall call;
    call.kind = kind;
    call.regions.reserve(group.size());
    std::vector<std::shared_ptr<RequestStatus>> statuses;
    statuses.reserve(group.size());
    for (const Request& r : group) {
      const std::lock_guard lock(r.status->mutex);
      r.status->pending_calls = 1;
      statuses.push_back(r.status);
    }
    char* buffer = nullptr;
    std::vector<CopyRegion> scatter;  // device->host: staging -> the host destinations
    if (kind == CopyKind::kDeviceToDevice) {
      for (const Request& r : group) call.regions.push_back(CopyRegion{r.dst, r.src, r.bytes});
    } else {
      std::size_t total = 0;
      for (const Request& r : group) total += round_up(r.bytes, kMinAlignment);
      buffer = static_cast<char*>(staging_.allocate(total));
      std::size_t offset = 0;
      for (const Request& r : group) {
        if (kind == CopyKind::kHostToDevice) {
          std::memcpy(buffer + offset, r.src, r.bytes);  // gather into pinned staging
          call.regions.push_back(CopyRegion{r.dst, buffer + offset, r.bytes});
        } else {
          call.regions.push_back(CopyRegion{buffer + offset, r.src, r.bytes});
          scatter.push_back(CopyRegion{r.dst, buffer + offset, r.bytes});
        }
        offset += round_up(r.bytes, kMinAlignment);
      }
    }
    StagingPool* staging = &staging_;
    call.done = [staging, buffer, statuses,
                 scatter = std::move(scatter)](const std::exception_ptr& e) {
      if (!e) {
        for (const CopyRegion& s : scatter) std::memcpy(s.dst, s.src, s.bytes);
      }
      if (buffer != nullptr) staging->deallocate(buffer);
      for (const auto& status : statuses) status->call_ended(e);
    };
    {
      const std::lock_guard lock(mutex_);
      stats_.packed_requests += group.size();
    }
    submit(std::move(call), stream_of(kind), group);
  } catch (const std::exception& e) {
    const std::lock_guard lock(mutex_);
    for (const Request& r : group) r.status->end(TransferState::kFailed, e.what());
    stats_.failed_requests += group.size();
  }
}

void EngineCore::flush_large(const Request& r) {
  const void* host = host_side(r.kind, r.dst, r.src);
  bool direct = host == nullptr;
  if (!direct) {
    const std::lock_guard lock(mutex_);
    direct = is_pinned_locked(host, r.bytes);
  }
  try {
    if (direct) {
      {
        const std::lock_guard lock(r.status->mutex);
        r.status->pending_calls = 1;
      }
      CopyCall call{r.kind, {CopyRegion{r.dst, r.src, r.bytes}}, nullptr};
      call.done = [status = r.status](const std::exception_ptr& e) { status->call_ended(e); };
      {
        const std::lock_guard lock(mutex_);
        ++stats_.direct_requests;
      }
      submit(std::move(call), stream_of(r.kind), {r});
      return;
    }
    const std::size_t chunks = (r.bytes + options_.chunk_bytes - 1) / options_.chunk_bytes;
    {
      const std::lock_guard lock(r.status->mutex);
      r.status->pending_calls = chunks;
    }
    {
      const std::lock_guard lock(mutex_);
      ++stats_.chunked_requests;
    }
    StagingPool* staging = &staging_;
    for (std::size_t i = 0; i < chunks; ++i) {
      const std::size_t offset = i * options_.chunk_bytes;
      const std::size_t length = std::min(options_.chunk_bytes, r.bytes - offset);
      // Waits while the budget is taken by chunks in flight: the pipeline's depth.
      auto* buffer = static_cast<char*>(staging_.allocate(length));
      CopyCall call;
      call.kind = r.kind;
      CopyRegion back{};  // device->host: staging -> host, once the chunk has landed
      if (r.kind == CopyKind::kHostToDevice) {
        std::memcpy(buffer, static_cast<const char*>(r.src) + offset, length);
        call.regions.push_back(CopyRegion{static_cast<char*>(r.dst) + offset, buffer, length});
      } else {
        call.regions.push_back(
            CopyRegion{buffer, static_cast<const char*>(r.src) + offset, length});
        back = CopyRegion{static_cast<char*>(r.dst) + offset, buffer, length};
      }
      call.done = [staging, buffer, back, status = r.status](const std::exception_ptr& e) {
        if (!e && back.dst != nullptr) std::memcpy(back.dst, back.src, back.bytes);
        staging->deallocate(buffer);
        status->call_ended(e);
      };
      submit(std::move(call), stream_of(r.kind), {r});
    }
  } catch (const std::exception& e) {
    r.status->end(TransferState::kFailed, e.what());
    const std::lock_guard lock(mutex_);
    ++stats_.failed_requests;
  }
}

void EngineCore::synchronize() {
  flush();
  backend_.synchronize();
}

void EngineCore::stream_wait(const TransferHandle& handle, Stream compute_stream) {
  const auto& status = handle.status();
  if (!status) return;
  bool queued = false;
  {
    const std::lock_guard lock(status->mutex);
    queued = status->state == TransferState::kQueued;
  }
  if (queued) flush();
  std::shared_ptr<CopyFence> fence;
  {
    std::unique_lock lock(status->mutex);
    // Submitted but its fence not stored yet: the submit is returning; wait for it or the end.
    status->changed.wait(lock, [&] { return status->ended() || status->fence != nullptr; });
    if (!status->ended()) fence = status->fence;
  }
  if (fence) {
    backend_.stream_wait(*fence, compute_stream);
    return;
  }
  handle.wait();  // ended: throws when it failed or was cancelled
}

bool EngineCore::is_pinned_locked(const void* ptr, std::size_t bytes) const {
  if (staging_.state_of(ptr) == StagingPool::BlockState::kLive) return true;
  auto address = reinterpret_cast<std::uintptr_t>(ptr);
  const std::uintptr_t end = address + bytes;
  // Walk the registered chunks that cover [address, end) back to back.
  while (address < end) {
    auto it = pinned_.upper_bound(address);
    if (it == pinned_.begin()) return false;
    --it;
    if (address >= it->first + it->second) return false;
    address = it->first + it->second;
  }
  return true;
}

bool EngineCore::is_pinned(const void* ptr, std::size_t bytes) const {
  const std::lock_guard lock(mutex_);
  return is_pinned_locked(ptr, bytes);
}

void EngineCore::register_host(void* ptr, std::size_t bytes) {
  {
    const std::lock_guard lock(mutex_);
    if (registrations_.count(reinterpret_cast<std::uintptr_t>(ptr)) != 0) {
      throw InvalidArgument("TransferEngine::register_host: this memory is already registered");
    }
  }
  backend_.register_host(ptr, bytes);
  const std::lock_guard lock(mutex_);
  const auto base = reinterpret_cast<std::uintptr_t>(ptr);
  pinned_[base] = bytes;
  registrations_[base] = {base};
}

TransferHandle EngineCore::register_host_async(void* ptr, std::size_t bytes) {
  if (ptr == nullptr || bytes == 0) {
    throw InvalidArgument("TransferEngine::register_host_async: a null pointer or no bytes");
  }
  const auto base = reinterpret_cast<std::uintptr_t>(ptr);
  auto status = std::make_shared<RequestStatus>();
  status->state = TransferState::kSubmitted;
  {
    const std::lock_guard lock(mutex_);
    if (registrations_.count(base) != 0) {
      throw InvalidArgument(
          "TransferEngine::register_host_async: this memory is already registered");
    }
    registrations_[base] = {};
    registering_[base] = status;
    register_jobs_.push_back(RegisterJob{base, bytes, status});
    // One background thread for every registration: pinning runs at ~1-2 GB/s, and many
    // weights must not mean many threads.
    if (!registrar_.joinable()) registrar_ = std::thread([this] { run_registrar(); });
  }
  register_wake_.notify_all();
  return TransferHandle(std::move(status));
}

void EngineCore::run_registrar() {
  const std::size_t step = options_.register_chunk_bytes;
  for (;;) {
    RegisterJob job;
    {
      std::unique_lock lock(mutex_);
      register_wake_.wait(lock, [&] { return stopping_ || !register_jobs_.empty(); });
      if (register_jobs_.empty()) return;  // stopping, every registration done
      job = std::move(register_jobs_.front());
      register_jobs_.pop_front();
    }
    try {
      for (std::size_t offset = 0; offset < job.bytes; offset += step) {
        const std::size_t length = std::min(step, job.bytes - offset);
        backend_.register_host(reinterpret_cast<void*>(job.base + offset), length);
        const std::lock_guard books(mutex_);
        pinned_[job.base + offset] = length;
        registrations_[job.base].push_back(job.base + offset);
      }
      job.status->end(TransferState::kDone, {});
    } catch (const std::exception& e) {
      job.status->end(TransferState::kFailed,
                      std::string("TransferEngine::register_host_async: ") + e.what());
    }
    const std::lock_guard lock(mutex_);
    registering_.erase(job.base);
  }
}

void EngineCore::unregister_host(void* ptr) {
  const auto base = reinterpret_cast<std::uintptr_t>(ptr);
  std::shared_ptr<RequestStatus> pending;
  {
    const std::lock_guard lock(mutex_);
    if (registrations_.count(base) == 0) {
      throw InvalidPointer("TransferEngine::unregister_host: not the base of a registration", ptr);
    }
    if (const auto it = registering_.find(base); it != registering_.end()) pending = it->second;
  }
  if (pending) {  // an asynchronous registration of this range must end first
    std::unique_lock lock(pending->mutex);
    pending->changed.wait(lock, [&] { return pending->ended(); });
  }
  std::vector<std::uintptr_t> chunks;
  {
    const std::lock_guard lock(mutex_);
    chunks = std::move(registrations_[base]);
    registrations_.erase(base);
    for (const std::uintptr_t chunk : chunks) pinned_.erase(chunk);
  }
  backend_.synchronize();  // no copy may still read the pages being unlocked
  for (const std::uintptr_t chunk : chunks) {
    backend_.unregister_host(reinterpret_cast<void*>(chunk));
  }
}

TransferStats EngineCore::stats() const {
  const std::lock_guard lock(mutex_);
  return stats_;
}

void EngineCore::count_cancelled() {
  const std::lock_guard lock(mutex_);
  ++stats_.cancelled_requests;
}

}  // namespace transfer_detail

// --- the facade -----------------------------------------------------------------------------

TransferEngine::TransferEngine(CopyBackend& backend, TransferEngineOptions options)
    : core_(std::make_shared<transfer_detail::EngineCore>(backend, options)) {}

TransferEngine::~TransferEngine() {
  try {
    core_->synchronize();
  } catch (const std::exception&) {  // every request has ended either way
  }
}

TransferHandle TransferEngine::copy(CopyKind kind, void* dst, const void* src, std::size_t bytes) {
  return core_->copy(kind, dst, src, bytes);
}
void TransferEngine::flush() { core_->flush(); }
void TransferEngine::synchronize() { core_->synchronize(); }
void TransferEngine::stream_wait(const TransferHandle& handle, Stream compute_stream) {
  core_->stream_wait(handle, compute_stream);
}
void TransferEngine::register_host(void* ptr, std::size_t bytes) {
  core_->register_host(ptr, bytes);
}
TransferHandle TransferEngine::register_host_async(void* ptr, std::size_t bytes) {
  return core_->register_host_async(ptr, bytes);
}
void TransferEngine::unregister_host(void* ptr) { core_->unregister_host(ptr); }
bool TransferEngine::is_pinned(const void* ptr, std::size_t bytes) const {
  return core_->is_pinned(ptr, bytes);
}
MappedBuffer TransferEngine::map(std::size_t bytes) { return core_->backend().map_host(bytes); }
void TransferEngine::unmap(const MappedBuffer& buffer) { core_->backend().unmap_host(buffer); }
StagingPool& TransferEngine::staging() { return core_->staging(); }
CopyBackend& TransferEngine::backend() { return core_->backend(); }
const TransferEngineOptions& TransferEngine::options() const { return core_->options(); }
TransferStats TransferEngine::stats() const { return core_->stats(); }

}  // namespace sdalloc
