// malloc_entry.cpp - the exported malloc family: size and address decide who serves.
//
// Each entry point is a fast path of a few instructions and a slow path:
//  - a request below the threshold (or made while this thread is inside sdalloc) goes to
//    glibc's own entry point (system_allocator.hpp); the threshold is one relaxed load and
//    starts at 4 KiB, so the tiny requests of the dynamic loader and libc's start never
//    build anything;
//  - free / realloc / malloc_usable_size of a pointer outside the reserved range go to glibc
//    after one subtraction and one comparison (owns());
//  - the rest is the pool's (preload_runtime.hpp), with this thread marked as inside sdalloc
//    so that sdalloc's own allocations (vectors, strings, exceptions) go to glibc.
// No exception leaves an entry point: a failure is errno = ENOMEM and nullptr. errno is kept
// by free. When the pool is full the request goes to glibc instead (the report counts it).
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>

#include "core/bits.hpp"
#include "preload/inside_sdalloc.hpp"
#include "preload/preload_runtime.hpp"
#include "preload/system_allocator.hpp"

namespace sdalloc::preload {

// The flag of inside_sdalloc.hpp.
thread_local __attribute__((tls_model("initial-exec"))) bool t_inside = false;

namespace {

constexpr std::size_t kMinPoolAlignment = 16;  // what malloc promises on x86-64
constexpr std::size_t kPage = 4096;

bool is_small(std::size_t bytes) { return bytes < current_threshold() || t_inside; }

// `zeroed` (calloc's share): glibc's calloc, which knows which of its pages are fresh; a
// memset after glibc's malloc would touch every page of a block glibc just mapped.
void* system_allocate(std::size_t bytes, std::size_t alignment, bool zeroed = false) {
  if (zeroed) return __libc_calloc(1, bytes);
  return alignment <= kMinPoolAlignment ? __libc_malloc(bytes) : __libc_memalign(alignment, bytes);
}

// The pool's share of a request of `bytes` (>= the threshold). Falls back to glibc when the
// pool is off or full. `fresh` (calloc only) receives the fresh pages the request mapped; a
// calloc that falls back is glibc's calloc, zeroed already.
void* large_allocate(std::size_t bytes, std::size_t alignment, FreshPages* fresh = nullptr) {
  if (alignment > sdalloc::kPoolMaxAlignment || bytes > sdalloc::kPoolMaxAllocation) {
    // beyond any pool: glibc says ENOMEM itself
    return system_allocate(bytes, alignment, fresh != nullptr);
  }
  void* ptr = nullptr;
  {
    InsideScope inside;
    Runtime* runtime = Runtime::get();
    // The first large request builds the runtime, and may be below the threshold it sets.
    if (runtime != nullptr && bytes >= current_threshold()) {
      FreshPages& pages = FreshPages::of_this_thread();
      pages.clear();
      try {
        ptr =
            runtime->allocate(bytes, alignment < kMinPoolAlignment ? kMinPoolAlignment : alignment);
      } catch (const std::exception&) {
        errno = ENOMEM;
        return nullptr;
      }
      if (ptr != nullptr) {
        if (fresh != nullptr) *fresh = pages;
        inside.keep_errno();
        return ptr;
      }
    }
    inside.keep_errno();
  }
  if (fresh != nullptr) fresh->clear();
  return system_allocate(bytes, alignment, fresh != nullptr);
}

void large_free(void* ptr) {
  InsideScope inside;
  if (Runtime* runtime = Runtime::built(); runtime != nullptr) runtime->free(ptr);
  inside.keep_errno();
}

std::size_t usable_size_of(void* ptr) {
  if (!owns(ptr)) return system_usable_size(ptr);
  InsideScope inside;
  Runtime* runtime = Runtime::built();
  const std::size_t size = runtime == nullptr ? 0 : runtime->usable_size(ptr);
  inside.keep_errno();
  return size;
}

void* allocate(std::size_t bytes, std::size_t alignment) {
  if (is_small(bytes)) return system_allocate(bytes, alignment);
  return large_allocate(bytes, alignment);
}

void release(void* ptr) {
  if (owns(ptr)) {
    large_free(ptr);
  } else {
    __libc_free(ptr);
  }
}

// Writes zeros over [ptr, ptr + bytes) but the fresh pages the allocation mapped.
void zero_but_fresh(void* ptr, std::size_t bytes, const FreshPages& fresh) {
  const auto begin = reinterpret_cast<std::uintptr_t>(ptr);
  const std::uintptr_t end = begin + bytes;
  const std::uintptr_t fresh_begin = fresh.begin < begin ? begin : fresh.begin;
  const std::uintptr_t fresh_end = fresh.end > end ? end : fresh.end;
  std::size_t skipped = 0;
  if (fresh_begin < fresh_end) {
    std::memset(ptr, 0, fresh_begin - begin);
    std::memset(reinterpret_cast<void*>(fresh_end), 0, end - fresh_end);
    skipped = fresh_end - fresh_begin;
  } else {
    std::memset(ptr, 0, bytes);
  }
  if (Runtime* runtime = Runtime::built(); runtime != nullptr) {
    runtime->counters().fresh_bytes.fetch_add(skipped, std::memory_order_relaxed);
    runtime->counters().zeroed_bytes.fetch_add(bytes - skipped, std::memory_order_relaxed);
  }
}

void* aligned(std::size_t alignment, std::size_t bytes) {
  // glibc's memalign treats 0 as 1 and rounds an alignment that is not a power of two up
  // to one.
  if (alignment == 0) alignment = 1;
  if (!is_power_of_two(alignment)) {
    if (alignment > (std::size_t{1} << 62)) {
      errno = EINVAL;
      return nullptr;
    }
    alignment = std::size_t{1} << (64 - __builtin_clzll(alignment));
  }
  return allocate(bytes, alignment);
}

}  // namespace
}  // namespace sdalloc::preload

// =======================================================================================
// The exported C functions

using namespace sdalloc::preload;  // NOLINT(google-build-using-namespace): the C layer

extern "C" {

__attribute__((visibility("default"))) void* malloc(std::size_t bytes) {
  if (is_small(bytes)) return __libc_malloc(bytes);
  return large_allocate(bytes, kMinPoolAlignment);
}

__attribute__((visibility("default"))) void free(void* ptr) {
  if (owns(ptr)) {
    large_free(ptr);
    return;
  }
  __libc_free(ptr);
}

__attribute__((visibility("default"))) void* calloc(std::size_t count, std::size_t bytes) {
  std::size_t total = 0;
  if (__builtin_mul_overflow(count, bytes, &total)) {
    errno = ENOMEM;
    return nullptr;
  }
  if (is_small(total)) return __libc_calloc(count, bytes);
  FreshPages fresh;
  void* ptr = large_allocate(total, kMinPoolAlignment, &fresh);
  if (ptr == nullptr) return nullptr;
  if (!owns(ptr)) return ptr;  // glibc's calloc served it (pool off or full): zeroed
  zero_but_fresh(ptr, total, fresh);
  return ptr;
}

__attribute__((visibility("default"))) void* realloc(void* ptr, std::size_t bytes) {
  if (ptr == nullptr) return malloc(bytes);
  const bool ours = owns(ptr);
  if (!ours && is_small(bytes)) return __libc_realloc(ptr, bytes);
  if (bytes == 0) {  // glibc frees and answers nullptr
    free(ptr);
    return nullptr;
  }
  const std::size_t old_bytes = usable_size_of(ptr);
  // Shrinking a pool block by less than half keeps it where it is.
  if (ours && bytes <= old_bytes && bytes >= old_bytes / 2 && !is_small(bytes)) return ptr;
  void* moved = allocate(bytes, kMinPoolAlignment);
  if (moved == nullptr) return nullptr;  // errno is ENOMEM; ptr is untouched
  std::memcpy(moved, ptr, old_bytes < bytes ? old_bytes : bytes);
  release(ptr);
  if (Runtime* runtime = Runtime::built(); runtime != nullptr) {
    runtime->counters().reallocs_moved.fetch_add(1, std::memory_order_relaxed);
  }
  return moved;
}

__attribute__((visibility("default"))) void* reallocarray(void* ptr, std::size_t count,
                                                          std::size_t bytes) {
  std::size_t total = 0;
  if (__builtin_mul_overflow(count, bytes, &total)) {
    errno = ENOMEM;
    return nullptr;
  }
  return realloc(ptr, total);
}

__attribute__((visibility("default"))) void* memalign(std::size_t alignment, std::size_t bytes) {
  return aligned(alignment, bytes);
}

__attribute__((visibility("default"))) void* aligned_alloc(std::size_t alignment,
                                                           std::size_t bytes) {
  return aligned(alignment, bytes);
}

__attribute__((visibility("default"))) int posix_memalign(void** out, std::size_t alignment,
                                                          std::size_t bytes) {
  if (!sdalloc::is_power_of_two(alignment) || alignment % sizeof(void*) != 0) return EINVAL;
  const int saved = errno;
  void* ptr = allocate(bytes, alignment);
  if (ptr == nullptr) {
    errno = saved;
    return ENOMEM;
  }
  *out = ptr;
  return 0;
}

__attribute__((visibility("default"))) void* valloc(std::size_t bytes) {
  return allocate(bytes, kPage);
}

__attribute__((visibility("default"))) void* pvalloc(std::size_t bytes) {
  if (bytes > SIZE_MAX - kPage) {
    errno = ENOMEM;
    return nullptr;
  }
  return allocate(bytes == 0 ? kPage : sdalloc::round_up(bytes, kPage), kPage);
}

__attribute__((visibility("default"))) std::size_t malloc_usable_size(void* ptr) {
  return usable_size_of(ptr);
}

// ---------------------------------------------------------------------------------------
// sdalloc's own entry points (sdalloc/preload.h)

__attribute__((visibility("default"))) int sdalloc_preload_owns(const void* ptr) {
  return owns(ptr) ? 1 : 0;
}

__attribute__((visibility("default"))) std::size_t sdalloc_preload_threshold(void) {
  return Runtime::built() == nullptr ? 0 : current_threshold();
}

__attribute__((visibility("default"))) int sdalloc_preload_begin_step(void) {
  InsideScope inside;
  Runtime* runtime = Runtime::get();
  bool ok = false;
  try {
    ok = runtime != nullptr && runtime->begin_step();
  } catch (const std::exception&) {
  }
  inside.keep_errno();
  return ok ? 0 : -1;
}

__attribute__((visibility("default"))) int sdalloc_preload_end_step(void) {
  InsideScope inside;
  Runtime* runtime = Runtime::built();
  bool ok = false;
  try {
    ok = runtime != nullptr && runtime->end_step();
  } catch (const std::exception&) {
  }
  inside.keep_errno();
  return ok ? 0 : -1;
}

}  // extern "C"

namespace {
// Early: SDALLOC_CONF is read when the library is loaded, so a bad one is reported by every
// program, not only those that make a large request.
__attribute__((constructor)) void sdalloc_preload_at_load() {
  InsideScope inside;
  Runtime::get();
  inside.keep_errno();
}

// Late: the preloaded library is among the last to be finalised, after the program's own
// atexit handlers and the other libraries' destructors have freed what they free.
__attribute__((destructor)) void sdalloc_preload_at_exit() {
  if (Runtime* runtime = Runtime::built(); runtime != nullptr) {
    InsideScope inside;
    runtime->at_exit();
  }
}
}  // namespace
