// tools/sdalloc/replay/torch_expandable_segment.hpp - one growing range of PyTorch's model.
//
// With expandable_segments:True, PyTorch's caching allocator keeps, per stream and pool, one
// range of reserved address space (about 1 1/8 times the device's memory) and maps physical
// pages into it as requests need them: pages of 2 MiB in the small pool's range, 20 MiB in
// the large pool's, each page its own physical allocation (cuMemCreate) so any one can be
// unmapped later. ExpandableSegment is that range over a sdalloc::VirtualMemory (the host's
// HostVirtualMemory in `sdalloc replay`, so the pages are real memory that can be written).
//  - map(ptr, bytes): ptr at a page boundary; creates and maps the pages that cover
//    [ptr, ptr + bytes) and answers how many bytes from ptr are now mapped (whole pages).
//    When the memory runs out it undoes what it did and answers 0, as PyTorch's does.
//  - unmap(ptr, bytes): unmaps and frees the pages lying wholly inside [ptr, ptr + bytes),
//    answers the stretch unmapped (bytes 0: no whole page).
// The destructor unmaps what is still mapped and releases the range. Not thread-safe: the
// model above it serialises the calls.
#pragma once

#include <cstddef>
#include <vector>

#include "sdalloc/core/stream.hpp"
#include "sdalloc/core/virtual_memory.hpp"

namespace sdalloc::replay {

struct PageStretch {
  char* ptr = nullptr;
  std::size_t bytes = 0;
};

class ExpandableSegment {
 public:
  // Reserves `pages` pages of `page_bytes` (a multiple of vm.granularity()). Throws what
  // vm.reserve throws (OutOfMemory when no such address range is free).
  ExpandableSegment(VirtualMemory& vm, Stream stream, std::size_t page_bytes, std::size_t pages);
  ~ExpandableSegment();
  ExpandableSegment(const ExpandableSegment&) = delete;
  ExpandableSegment& operator=(const ExpandableSegment&) = delete;

  char* base() const { return base_; }
  std::size_t bytes() const { return page_bytes_ * pages_.size(); }
  std::size_t page_bytes() const { return page_bytes_; }
  std::size_t mapped_bytes() const { return mapped_pages_ * page_bytes_; }

  std::size_t map(char* ptr, std::size_t bytes);
  PageStretch unmap(char* ptr, std::size_t bytes);

 private:
  std::size_t page_of(const char* ptr) const {
    return static_cast<std::size_t>(ptr - base_) / page_bytes_;
  }
  void release_pages(std::size_t begin, std::size_t end, bool mapped);

  VirtualMemory& vm_;
  Stream stream_;
  std::size_t page_bytes_;
  char* base_ = nullptr;
  std::vector<PhysicalChunk> pages_;  // bytes 0: not mapped
  std::size_t mapped_pages_ = 0;
};

}  // namespace sdalloc::replay
