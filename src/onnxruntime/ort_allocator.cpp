// ort_allocator.cpp - OrtPoolAllocator's entry points: ORT's C calls to an AnyPool, every
// exception caught at the boundary (sdalloc/onnxruntime/ort_allocator.hpp).
//
// Invariant: outstanding_ counts pointers handed out and not yet freed here; it is what the
// destructor checks, since the pool's own live count may include other users' memory.
#include "sdalloc/onnxruntime/ort_allocator.hpp"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <tuple>
#include <utility>

#include "sdalloc/core/errors.hpp"

namespace sdalloc::onnxruntime {

namespace {

constexpr std::size_t kOrtAlignment = 256;  // sdalloc's minimum; ORT asks for 64

void update_max(std::atomic<std::size_t>& target, std::size_t value) {
  std::size_t seen = target.load(std::memory_order_relaxed);
  while (value > seen && !target.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

// The registrations OrtEnvAllocator holds, process-wide: ORT 1.29's RegisterAllocator
// silently replaces an allocator registered for the same memory info (its header says it
// refuses), so the second registration is refused here instead.
struct RegistrationKey {
  const OrtEnv* env;
  std::string name;
  int type;
  int device;
  int memory;
  friend bool operator<(const RegistrationKey& a, const RegistrationKey& b) {
    return std::tie(a.env, a.name, a.type, a.device, a.memory) <
           std::tie(b.env, b.name, b.type, b.device, b.memory);
  }
};

std::mutex registry_mutex;
std::set<RegistrationKey>& registry() {
  static std::set<RegistrationKey> keys;
  return keys;
}

RegistrationKey key_of(const OrtEnv* env, const OrtPoolAllocatorOptions& o) {
  return {env, o.memory_name, static_cast<int>(o.allocator_type), o.device_id,
          static_cast<int>(o.memory_type)};
}

}  // namespace

const OrtApi& ort_api() {
  const OrtApi* api = OrtGetApiBase()->GetApi(ORT_API_VERSION);
  if (api == nullptr) {
    throw Error("ONNX Runtime " + std::string(OrtGetApiBase()->GetVersionString()) +
                " does not offer API version " + std::to_string(ORT_API_VERSION) +
                " (the header's); load ORT 1.29 or newer");
  }
  return *api;
}

void throw_if_failed(OrtStatus* status, const char* what) {
  if (status == nullptr) return;
  const OrtApi& api = ort_api();
  std::string message = std::string(what) + ": " + api.GetErrorMessage(status);
  api.ReleaseStatus(status);
  throw InvalidArgument(message);
}

OrtPoolAllocator::OrtPoolAllocator(std::shared_ptr<AnyPool> pool, OrtPoolAllocatorOptions options)
    : pool_(std::move(pool)), options_(std::move(options)) {
  if (!pool_) throw InvalidArgument("OrtPoolAllocator needs a pool");
  throw_if_failed(ort_api().CreateMemoryInfo(options_.memory_name.c_str(), options_.allocator_type,
                                             options_.device_id, options_.memory_type, &info_),
                  "CreateMemoryInfo");
  entry_.version = ORT_API_VERSION;
  entry_.Alloc = &alloc_entry;
  entry_.Free = &free_entry;
  entry_.Info = &info_entry;
  entry_.Reserve = &reserve_entry;
  entry_.GetStats = &stats_entry;
  entry_.AllocOnStream = &alloc_on_stream_entry;
  entry_.Shrink = &shrink_entry;
  entry_.owner = this;
}

OrtPoolAllocator::~OrtPoolAllocator() {
  const std::size_t out = outstanding_.load();
  if (out != 0) {
    // ORT would free these later through a dead allocator: refuse loudly (see the header).
    std::fprintf(stderr,
                 "sdalloc: OrtPoolAllocator destroyed while ONNX Runtime holds %zu allocations "
                 "(%zu bytes live in the pool): release sessions and OrtValues first\n",
                 out, pool_->stats().live_bytes);
    std::abort();
  }
  ort_api().ReleaseMemoryInfo(info_);
}

OrtPoolAllocator& OrtPoolAllocator::self(const OrtAllocator* a) {
  return *static_cast<const Entry*>(a)->owner;
}

void OrtPoolAllocator::note_error(const char* what) noexcept {
  try {
    const std::lock_guard lock(error_mutex_);
    last_error_ = what;
  } catch (...) {  // NOLINT(bugprone-empty-catch): a message we cannot keep is dropped
  }
}

void* OrtPoolAllocator::allocate(std::size_t size, Stream stream, bool reserve) noexcept {
  if (size == 0) return nullptr;
  try {
    void* p = pool_->allocate(size, kOrtAlignment, stream);
    if (p == nullptr) throw Error("the pool returned no memory");
    if (stream != kDefaultStream) {
      try {
        const std::lock_guard lock(streams_mutex_);
        pointer_streams_.emplace(p, stream);
        stream_pointers_.fetch_add(1);
      } catch (...) {
        pool_->free(p, stream);
        throw;
      }
    }
    (reserve ? reserves_ : allocs_).fetch_add(1, std::memory_order_relaxed);
    outstanding_.fetch_add(1, std::memory_order_relaxed);
    update_max(max_alloc_size_, size);
    return p;
  } catch (const std::exception& e) {
    failed_allocs_.fetch_add(1, std::memory_order_relaxed);
    note_error(e.what());
  } catch (...) {
    failed_allocs_.fetch_add(1, std::memory_order_relaxed);
    note_error("unknown error");
  }
  return nullptr;
}

void OrtPoolAllocator::release(void* p) noexcept {
  if (p == nullptr) return;
  try {
    Stream stream = kDefaultStream;
    if (stream_pointers_.load() != 0) {
      const std::lock_guard lock(streams_mutex_);
      if (auto it = pointer_streams_.find(p); it != pointer_streams_.end()) {
        stream = it->second;
        pointer_streams_.erase(it);
        stream_pointers_.fetch_sub(1);
      }
    }
    pool_->free(p, stream);
    frees_.fetch_add(1, std::memory_order_relaxed);
    outstanding_.fetch_sub(1, std::memory_order_relaxed);
  } catch (const std::exception& e) {
    foreign_frees_.fetch_add(1, std::memory_order_relaxed);
    note_error(e.what());
  } catch (...) {
    foreign_frees_.fetch_add(1, std::memory_order_relaxed);
    note_error("unknown error");
  }
}

void* OrtPoolAllocator::answer(std::size_t size, Stream stream, bool reserve) {
  void* p = allocate(size, stream, reserve);
  if (p == nullptr && size != 0 && options_.on_failure == OrtAllocFailure::kThrowBadAlloc) {
    // ORT's own allocators throw on failure and its executor turns that into a status;
    // a nullptr is not checked everywhere in ORT 1.29 (see the header).
    throw std::bad_alloc();
  }
  return p;
}

void* ORT_API_CALL OrtPoolAllocator::alloc_entry(OrtAllocator* a, std::size_t size) {
  return self(a).answer(size, kDefaultStream, false);
}

void* ORT_API_CALL OrtPoolAllocator::reserve_entry(OrtAllocator* a, std::size_t size) {
  return self(a).answer(size, kDefaultStream, true);
}

void* ORT_API_CALL OrtPoolAllocator::alloc_on_stream_entry(OrtAllocator* a, std::size_t size,
                                                           OrtSyncStream* stream) {
  // Stream 0 for a null stream; ORT's handle (a cudaStream_t on CUDA) otherwise.
  const Stream s = stream != nullptr ? Stream::from_native(ort_api().SyncStream_GetHandle(stream))
                                     : kDefaultStream;
  return self(a).answer(size, s, false);
}

void ORT_API_CALL OrtPoolAllocator::free_entry(OrtAllocator* a, void* p) noexcept {
  self(a).release(p);
}

const OrtMemoryInfo* ORT_API_CALL OrtPoolAllocator::info_entry(const OrtAllocator* a) noexcept {
  return self(a).info_;
}

OrtStatus* ORT_API_CALL OrtPoolAllocator::stats_entry(const OrtAllocator* a,
                                                      OrtKeyValuePairs** out) noexcept {
  try {
    const OrtApi& api = ort_api();
    if (out == nullptr) return api.CreateStatus(ORT_INVALID_ARGUMENT, "GetStats: out is null");
    const OrtPoolAllocator& me = self(a);
    const PoolStats s = me.pool_->stats();
    const OrtPoolAllocatorCounters c = me.counters();
    OrtKeyValuePairs* kvps = nullptr;
    api.CreateKeyValuePairs(&kvps);
    const auto add = [&](const char* key, auto value) {
      api.AddKeyValuePair(kvps, key, std::to_string(value).c_str());
    };
    // ORT's arena keys (onnxruntime_c_api.h, OrtAllocator::GetStats).
    add("Limit", me.options_.limit_bytes);
    add("InUse", s.live_bytes);
    add("TotalAllocated", s.reserved_bytes);
    add("MaxInUse", s.peak_live_bytes);
    add("NumAllocs", c.allocs);
    add("NumReserves", c.reserves);
    add("NumArenaExtensions", s.segment_allocations);
    add("NumArenaShrinkages", s.segment_releases);
    add("MaxAllocSize", c.max_alloc_size);
    // sdalloc's own.
    add("sdalloc.PeakTotalAllocated", s.peak_reserved_bytes);
    add("sdalloc.InUseBlocks", s.allocated_bytes);
    add("sdalloc.Outstanding", c.outstanding);
    add("sdalloc.FailedAllocs", c.failed_allocs);
    add("sdalloc.ForeignFrees", c.foreign_frees);
    api.AddKeyValuePair(kvps, "sdalloc.Pool", me.pool_->name().c_str());
    *out = kvps;
    return nullptr;
  } catch (const std::exception& e) {
    try {
      return ort_api().CreateStatus(ORT_FAIL, e.what());
    } catch (...) {
      return nullptr;
    }
  } catch (...) {
    return nullptr;
  }
}

OrtStatus* ORT_API_CALL OrtPoolAllocator::shrink_entry(OrtAllocator* a) noexcept {
  try {
    self(a).pool_->trim();
    return nullptr;
  } catch (const std::exception& e) {
    try {
      return ort_api().CreateStatus(ORT_FAIL, e.what());
    } catch (...) {
      return nullptr;
    }
  }
}

OrtPoolAllocatorCounters OrtPoolAllocator::counters() const {
  OrtPoolAllocatorCounters c;
  c.allocs = allocs_.load();
  c.reserves = reserves_.load();
  c.failed_allocs = failed_allocs_.load();
  c.frees = frees_.load();
  c.foreign_frees = foreign_frees_.load();
  c.outstanding = outstanding_.load();
  c.max_alloc_size = max_alloc_size_.load();
  return c;
}

std::string OrtPoolAllocator::last_error() const {
  const std::lock_guard lock(error_mutex_);
  return last_error_;
}

OrtEnvAllocator::OrtEnvAllocator(OrtEnv* env, OrtPoolAllocator& allocator)
    : env_(env), allocator_(allocator) {
  if (env == nullptr) throw InvalidArgument("OrtEnvAllocator needs an OrtEnv");
  const OrtPoolAllocatorOptions& o = allocator_.options();
  const std::lock_guard lock(registry_mutex);
  if (registry().count(key_of(env_, o)) != 0) {
    throw InvalidArgument("RegisterAllocator: an sdalloc allocator for memory '" + o.memory_name +
                          "' (device " + std::to_string(o.device_id) +
                          ") is already registered on this OrtEnv; destroy its OrtEnvAllocator "
                          "first (ORT would silently replace it)");
  }
  throw_if_failed(ort_api().RegisterAllocator(env_, allocator_.get()),
                  "RegisterAllocator (sdalloc's OrtPoolAllocator)");
  registry().insert(key_of(env_, o));
}

OrtEnvAllocator::~OrtEnvAllocator() {
  OrtStatus* status = ort_api().UnregisterAllocator(env_, allocator_.memory_info());
  if (status != nullptr) ort_api().ReleaseStatus(status);
  const std::lock_guard lock(registry_mutex);
  registry().erase(key_of(env_, allocator_.options()));
}

}  // namespace sdalloc::onnxruntime
