// mapped_pages.hpp - whether a range of the test process's address space is mapped, for
// tests that check a resource really gave memory back to the kernel, and what its pages hold.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <vector>

namespace sdalloc::test {

inline unsigned char* bytes_of(void* ptr) { return static_cast<unsigned char*>(ptr); }

// How many 4 KiB pages of [ptr, ptr + bytes) hold `value` in their first byte: whose pages
// a range got (moved ones keep what was written, fresh ones are zero).
inline std::size_t pages_holding(void* ptr, std::size_t bytes, unsigned char value) {
  std::size_t n = 0;
  for (std::size_t off = 0; off < bytes; off += 4096) n += bytes_of(ptr)[off] == value ? 1 : 0;
  return n;
}

// True when no page of [ptr, ptr + bytes) is mapped any more (mincore fails with ENOMEM).
inline bool is_unmapped(void* ptr, std::size_t bytes) {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> residency(bytes / page + 1);
  return ::mincore(ptr, bytes, residency.data()) != 0 && errno == ENOMEM;
}

}  // namespace sdalloc::test
