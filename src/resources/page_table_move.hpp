// page_table_move.hpp - moving mapped pages to another address with their page tables
// (mremap with MREMAP_DONTUNMAP): the one way the two host VirtualMemory implementations
// (HostVirtualMemory and the drop-in's RangeVirtualMemory) move their private anonymous
// pages (internal).
#pragma once

#include <sys/mman.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>

#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4  // Linux 5.7 (shared mappings: 5.13); older C headers lack it
#endif

namespace sdalloc::detail {

// Moves the mapping [from, from + bytes) to `to`, page tables and all. `from` stays mapped to
// the same extent without page tables (never a hole another mmap could land in) until the
// caller makes it reserved space again. Answers 0 or the errno of the refused mremap, in
// which case nothing moved.
inline int move_with_page_tables(void* from, void* to, std::size_t bytes) {
  return ::mremap(from, bytes, bytes, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP, to) ==
                 MAP_FAILED
             ? errno
             : 0;
}

// Whether the kernel moves private anonymous pages with MREMAP_DONTUNMAP (Linux 5.7): tried
// on a written scratch page, which must arrive with what was written. Both host
// implementations ask once, at construction.
inline bool can_move_private_pages() {
  constexpr std::size_t kPage = 4096;
  void* area =
      ::mmap(nullptr, 2 * kPage, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (area == MAP_FAILED) return false;
  char* first = static_cast<char*>(area);
  bool works = false;
  if (::mmap(first, kPage, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) != MAP_FAILED) {
    *static_cast<volatile char*>(first) = 'm';
    works = move_with_page_tables(first, first + kPage, kPage) == 0 &&
            static_cast<volatile char*>(first + kPage)[0] == 'm';
  }
  ::munmap(area, 2 * kPage);  // both pages, the emptied one included
  return works;
}

}  // namespace sdalloc::detail
