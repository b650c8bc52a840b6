#include "replay/torch_expandable_segment.hpp"

#include <string>

#include "sdalloc/core/errors.hpp"

namespace sdalloc::replay {

ExpandableSegment::ExpandableSegment(VirtualMemory& vm, Stream stream, std::size_t page_bytes,
                                     std::size_t pages)
    : vm_(vm), stream_(stream), page_bytes_(page_bytes), pages_(pages) {
  base_ = static_cast<char*>(vm_.reserve(page_bytes_ * pages));
}

ExpandableSegment::~ExpandableSegment() {
  try {
    for (std::size_t i = 0; i < pages_.size(); ++i) {
      if (pages_[i].bytes != 0) release_pages(i, i + 1, /*mapped=*/true);
    }
    vm_.release(base_, bytes());
  } catch (const Error&) {
    // A broken system call while tearing down: what was being freed is lost (leaked), as
    // the VirtualMemory contract says; a destructor must not throw.
  }
}

// Creates every page first and maps them after, as PyTorch does (cuMemCreate for each
// handle, then cuMemMap), so that running out of memory is found before anything is mapped.
std::size_t ExpandableSegment::map(char* ptr, std::size_t bytes) {
  const std::size_t begin = page_of(ptr);
  const std::size_t end =
      (static_cast<std::size_t>(ptr - base_) + bytes + page_bytes_ - 1) / page_bytes_;
  if (ptr != base_ + begin * page_bytes_ || end > pages_.size()) {
    throw InvalidArgument("expandable segment: map of " + std::to_string(bytes) +
                          " bytes at offset " + std::to_string(ptr - base_) +
                          " is not a stretch of whole pages inside the range");
  }
  for (std::size_t i = begin; i < end; ++i) {
    if (pages_[i].bytes != 0) {
      throw InvalidArgument("expandable segment: page " + std::to_string(i) + " is mapped already");
    }
  }
  std::size_t created = begin;
  std::size_t mapped = begin;
  try {
    for (; created < end; ++created) pages_[created] = vm_.create(page_bytes_);
    for (; mapped < end; ++mapped) vm_.map(base_ + mapped * page_bytes_, pages_[mapped]);
  } catch (const OutOfMemory&) {
    release_pages(begin, mapped, /*mapped=*/true);
    release_pages(mapped, created, /*mapped=*/false);
    return 0;
  } catch (...) {
    release_pages(begin, mapped, /*mapped=*/true);
    release_pages(mapped, created, /*mapped=*/false);
    throw;
  }
  mapped_pages_ += end - begin;
  return (end - begin) * page_bytes_;
}

PageStretch ExpandableSegment::unmap(char* ptr, std::size_t bytes) {
  const auto offset = static_cast<std::size_t>(ptr - base_);
  const std::size_t begin = (offset + page_bytes_ - 1) / page_bytes_;
  const std::size_t end = (offset + bytes) / page_bytes_;
  if (begin >= end) return PageStretch{ptr, 0};
  release_pages(begin, end, /*mapped=*/true);
  mapped_pages_ -= end - begin;
  return PageStretch{base_ + begin * page_bytes_, (end - begin) * page_bytes_};
}

void ExpandableSegment::release_pages(std::size_t begin, std::size_t end, bool mapped) {
  for (std::size_t i = begin; i < end; ++i) {
    // The stream that used the page last: a device waits for its work before unmapping.
    if (mapped) vm_.unmap(base_ + i * page_bytes_, page_bytes_, stream_);
    vm_.destroy(pages_[i]);
    pages_[i] = PhysicalChunk{};
  }
}

}  // namespace sdalloc::replay
