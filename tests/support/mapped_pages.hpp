// mapped_pages.hpp - whether a range of the test process's address space is mapped, for
// tests that check a resource really gave memory back to the kernel.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <vector>

namespace sdalloc::test {

// True when no page of [ptr, ptr + bytes) is mapped any more (mincore fails with ENOMEM).
inline bool is_unmapped(void* ptr, std::size_t bytes) {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> residency(bytes / page + 1);
  return ::mincore(ptr, bytes, residency.data()) != 0 && errno == ENOMEM;
}

}  // namespace sdalloc::test
