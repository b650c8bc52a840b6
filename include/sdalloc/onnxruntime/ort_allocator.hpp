// sdalloc/onnxruntime/ort_allocator.hpp - any sdalloc pool as ONNX Runtime's OrtAllocator.
//
// OrtPoolAllocator is an OrtAllocator (ORT's C API, API version 29, ORT 1.29) whose memory
// comes from an AnyPool (policies/any_pool.hpp): a CachingPool, VirtualMemoryPool or
// PlannedArena. OrtEnvAllocator registers it on an OrtEnv; a session created with the
// session option "session.use_env_allocators" = "1" then takes every CPU allocation (the
// initializers, each Run()'s intermediate and output tensors) from it instead of ORT's own
// BFC arena.
//
// Entry points ORT calls:
//  - Alloc, Reserve: pool.allocate(size, 256, stream 0); zero bytes -> nullptr. A failure
//    (OutOfMemory beyond the pool's capacity, any error) is counted (failed_allocs), its
//    message kept (last_error), and then answered as options.on_failure says:
//      kThrowBadAlloc (default): std::bad_alloc, which is what ORT's own CPU allocator
//        does; ORT's executor catches it and Run() (or CreateSession) returns ORT's error,
//        the session and the process go on.
//      kReturnNull: nullptr, the letter of OrtAllocator's C contract. ORT 1.29 does not
//        check it everywhere: its internal wrapper of a custom OrtAllocator returns the
//        pointer unchecked, and CPU kernels then crash on it (SIGSEGV, or std::terminate
//        from a span check; tests/onnxruntime/ort_allocator_errors_test.cpp shows both
//        modes). For C callers that call the function pointers themselves.
//    Only these three entries can throw, and only std::bad_alloc. Reserve is counted apart
//    (ORT uses it for initializers).
//  - AllocOnStream: the same on the stream whose native handle ORT passes (a null stream is
//    stream 0); the pointer's stream is noted so that Free returns it on that stream (the
//    pool reuses it there at once, elsewhere after that stream's work as of the free).
//  - Free: pool.free on the pointer's stream. A pointer this allocator did not hand out is
//    refused by the pool (InvalidPointer): nothing is freed, the refusal is counted
//    (foreign_frees) and its message kept (last_error); ORT's Free cannot report it.
//  - Info: the OrtMemoryInfo made at construction (name "Cpu", OrtDeviceAllocator, device 0,
//    OrtMemTypeDefault by default: what ORT's CPU execution provider looks for).
//  - GetStats: the keys of ORT's own arena (Limit, InUse, TotalAllocated, MaxInUse,
//    NumAllocs, NumReserves, NumArenaExtensions, NumArenaShrinkages, MaxAllocSize) from the
//    pool's PoolStats, plus sdalloc's own under "sdalloc." names.
//  - Shrink: pool.trim().
//
// Lifetime, the documented rule: destroy in reverse order of creation - sessions and every
// OrtValue they produced, then the OrtEnvAllocator (it unregisters), then the
// OrtPoolAllocator, then the pool. The OrtPoolAllocator keeps the pool alive while it lives
// (it holds a shared_ptr), so dropping the caller's own reference to the pool early is
// harmless. Destroying the OrtPoolAllocator while ORT still holds memory from it (a session
// or OrtValue alive) would leave ORT freeing through a dead allocator later: it is refused
// by aborting the process with a message naming the bytes and allocations still out.
//
// Thread-safety: all entry points may be called concurrently (the pool is thread-safe; the
// stream table has its own lock). Registering the same memory info twice on one env is
// refused with InvalidArgument (OrtEnvAllocator).
#pragma once

#include <onnxruntime_c_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "sdalloc/core/pool_stats.hpp"
#include "sdalloc/core/stream.hpp"
#include "sdalloc/policies/any_pool.hpp"

namespace sdalloc::onnxruntime {

// The OrtApi of the ORT library this process loaded, at the header's API version; throws
// Error if the library is older than the header.
const OrtApi& ort_api();

// What Alloc, Reserve and AllocOnStream do when the pool refuses (see above).
enum class OrtAllocFailure { kThrowBadAlloc, kReturnNull };

struct OrtPoolAllocatorOptions {
  std::string memory_name = "Cpu";  // ORT's CPU device name (onnxruntime::CPU)
  OrtAllocatorType allocator_type = OrtDeviceAllocator;
  int device_id = 0;
  OrtMemType memory_type = OrtMemTypeDefault;
  std::int64_t limit_bytes = -1;  // the Limit key of GetStats: -1 when the pool has none
  OrtAllocFailure on_failure = OrtAllocFailure::kThrowBadAlloc;
};

// What the adapter itself counts (the pool's own figures are in stats()).
struct OrtPoolAllocatorCounters {
  std::uint64_t allocs = 0;         // Alloc and AllocOnStream calls served
  std::uint64_t reserves = 0;       // Reserve calls served
  std::uint64_t failed_allocs = 0;  // calls answered nullptr for a non-zero size
  std::uint64_t frees = 0;          // Free calls that returned memory
  std::uint64_t foreign_frees = 0;  // Free calls of pointers not handed out here
  std::size_t outstanding = 0;      // allocations handed out and not yet freed
  std::size_t max_alloc_size = 0;   // the largest single request served
};

class OrtPoolAllocator {
 public:
  // Throws Error if ORT refuses the memory info.
  explicit OrtPoolAllocator(std::shared_ptr<AnyPool> pool, OrtPoolAllocatorOptions options = {});
  OrtPoolAllocator(const OrtPoolAllocator&) = delete;
  OrtPoolAllocator& operator=(const OrtPoolAllocator&) = delete;
  // Aborts with a message if allocations are still out (see Lifetime above).
  ~OrtPoolAllocator();

  // The OrtAllocator to give ORT (valid while this object lives).
  OrtAllocator* get() { return &entry_; }
  const OrtMemoryInfo* memory_info() const { return info_; }
  const OrtPoolAllocatorOptions& options() const { return options_; }
  AnyPool& pool() { return *pool_; }
  PoolStats stats() const { return pool_->stats(); }
  OrtPoolAllocatorCounters counters() const;
  // The message of the last refused call (a foreign Free, a failed Alloc); empty if none.
  std::string last_error() const;

 private:
  // The struct ORT holds: OrtAllocator first, so ORT's pointer converts back to ours.
  struct Entry : OrtAllocator {
    OrtPoolAllocator* owner = nullptr;
  };
  static OrtPoolAllocator& self(const OrtAllocator* a);
  static void* ORT_API_CALL alloc_entry(OrtAllocator* a, std::size_t size);
  static void* ORT_API_CALL reserve_entry(OrtAllocator* a, std::size_t size);
  static void* ORT_API_CALL alloc_on_stream_entry(OrtAllocator* a, std::size_t size,
                                                  OrtSyncStream* stream);
  static void ORT_API_CALL free_entry(OrtAllocator* a, void* p) noexcept;
  static const OrtMemoryInfo* ORT_API_CALL info_entry(const OrtAllocator* a) noexcept;
  static OrtStatus* ORT_API_CALL stats_entry(const OrtAllocator* a,
                                             OrtKeyValuePairs** out) noexcept;
  static OrtStatus* ORT_API_CALL shrink_entry(OrtAllocator* a) noexcept;

  void* allocate(std::size_t size, Stream stream, bool reserve) noexcept;
  // nullptr for zero bytes; a failure as options_.on_failure says.
  void* answer(std::size_t size, Stream stream, bool reserve);
  void release(void* p) noexcept;
  void note_error(const char* what) noexcept;

  Entry entry_{};
  std::shared_ptr<AnyPool> pool_;
  OrtPoolAllocatorOptions options_;
  OrtMemoryInfo* info_ = nullptr;

  std::atomic<std::uint64_t> allocs_{0};
  std::atomic<std::uint64_t> reserves_{0};
  std::atomic<std::uint64_t> failed_allocs_{0};
  std::atomic<std::uint64_t> frees_{0};
  std::atomic<std::uint64_t> foreign_frees_{0};
  std::atomic<std::size_t> outstanding_{0};
  std::atomic<std::size_t> max_alloc_size_{0};

  // Pointers allocated on a stream other than 0 (AllocOnStream), so Free uses that stream;
  // the count lets the common case (no such pointer) skip the lock.
  mutable std::mutex streams_mutex_;
  std::unordered_map<void*, Stream> pointer_streams_;
  std::atomic<std::size_t> stream_pointers_{0};

  mutable std::mutex error_mutex_;
  std::string last_error_;
};

// An OrtPoolAllocator registered on an OrtEnv (RegisterAllocator) for as long as this object
// lives; the destructor unregisters it. Throws InvalidArgument if an OrtEnvAllocator for the
// same memory info already holds a registration on that env (ORT 1.29 itself would silently
// replace the first allocator, though its header says it refuses), or with ORT's message if
// ORT refuses.
class OrtEnvAllocator {
 public:
  OrtEnvAllocator(OrtEnv* env, OrtPoolAllocator& allocator);
  OrtEnvAllocator(const OrtEnvAllocator&) = delete;
  OrtEnvAllocator& operator=(const OrtEnvAllocator&) = delete;
  ~OrtEnvAllocator();

 private:
  OrtEnv* env_;
  OrtPoolAllocator& allocator_;
};

// Throws Error with ORT's message (and releases the status) when status is not null.
void throw_if_failed(OrtStatus* status, const char* what);

}  // namespace sdalloc::onnxruntime
