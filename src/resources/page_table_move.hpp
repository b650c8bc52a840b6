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

}  // namespace sdalloc::detail
