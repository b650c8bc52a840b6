// page_table_move.hpp - moving mapped pages to another address with their page tables
// (mremap with MREMAP_DONTUNMAP): HostVirtualMemory's shared memfd pages and the drop-in's
// private anonymous ones (RangeVirtualMemory, RangeResource) move the same way; and moving a
// range that spans several kernel mappings, which one mremap refuses (internal).
#pragma once

#include <sys/mman.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>

#include "core/bits.hpp"

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

// mremap moves within one kernel mapping (VMA) only (kernels before 6.17): a range made of
// several - an arena that was itself coalesced - answers EFAULT. Moves [from, from + length)
// to `to` with `move` (answers 0 or an errno), in halves of whole `page`s until each piece
// lies in one mapping; a piece `move` refuses otherwise goes to `refused(from, to, length)`,
// which answers whether it could make up for it. False when any piece's `refused` did not.
template <typename Move, typename Refused>
bool move_by_mapping(std::uintptr_t from, std::uintptr_t to, std::size_t length, std::size_t page,
                     const Move& move, const Refused& refused) {
  const int error = move(from, to, length);
  if (error == 0) return true;
  if (error == EFAULT && length > page) {
    const std::size_t half = round_up(length / 2, page);
    const bool first = move_by_mapping(from, to, half, page, move, refused);
    const bool second = move_by_mapping(from + half, to + half, length - half, page, move, refused);
    return first && second;
  }
  return refused(from, to, length);
}

}  // namespace sdalloc::detail
