// system_allocator.hpp - glibc's own malloc entry points, which the drop-in sends small
// requests (and every request made from inside sdalloc) to.
//
// glibc exports its allocator under __libc_* names besides the public ones, so calling them
// needs no dlsym (which may itself call malloc, and cannot run inside the dynamic loader
// before libc is relocated). malloc_usable_size has no such alias: system_usable_size() reads
// the chunk header the way glibc's own musable() does (glibc >= 2.26 on x86-64 and aarch64
// without memory tagging; the layout has not changed since 2.0).
#pragma once

#include <cstddef>

// glibc's own names: reserved identifiers, declared here because glibc exports them for
// exactly this use (an allocator that wraps it) and no header declares them.
// NOLINTBEGIN(bugprone-reserved-identifier)
extern "C" {
void* __libc_malloc(std::size_t bytes);
void __libc_free(void* ptr);
void* __libc_calloc(std::size_t count, std::size_t bytes);
void* __libc_realloc(void* ptr, std::size_t bytes);
void* __libc_memalign(std::size_t alignment, std::size_t bytes);
}
// NOLINTEND(bugprone-reserved-identifier)

namespace sdalloc::preload {

// glibc's malloc_usable_size(ptr) for a pointer glibc handed out (0 for nullptr).
inline std::size_t system_usable_size(const void* ptr) {
  if (ptr == nullptr) return 0;
  constexpr std::size_t kWord = sizeof(std::size_t);
  constexpr std::size_t kMmapped = 2;
  constexpr std::size_t kPrevInUse = 1;
  const auto* chunk = static_cast<const unsigned char*>(ptr) - 2 * kWord;
  std::size_t header;
  __builtin_memcpy(&header, chunk + kWord, kWord);
  const std::size_t size = header & ~std::size_t{7};
  if ((header & kMmapped) != 0) return size - 2 * kWord;
  // In use iff the next chunk says its predecessor is.
  std::size_t next_header;
  __builtin_memcpy(&next_header, chunk + size + kWord, kWord);
  return (next_header & kPrevInUse) != 0 ? size - kWord : 0;
}

}  // namespace sdalloc::preload
