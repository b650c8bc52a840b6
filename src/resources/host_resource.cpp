// host_resource.cpp - anonymous private mappings straight from the kernel.
//
// Every segment is its own mapping, so deallocate returns it to the system at once. With
// transparent huge pages the mapping must start on a 2 MiB boundary for the kernel to back
// it with huge pages; mmap only promises 4 KiB, so we map 2 MiB - 4 KiB more than needed and
// unmap the unaligned head and the tail. deallocate then unmaps exactly the kept range.
#include "sdalloc/resources/host_resource.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "core/bits.hpp"
#include "sdalloc/core/errors.hpp"

namespace sdalloc {
namespace {

[[noreturn]] void throw_out_of_memory(const std::string& where, std::size_t bytes,
                                      const std::string& what, int error) {
  OutOfMemoryInfo info;
  info.requested = bytes;
  throw OutOfMemory::describe(where, info, what + ": " + std::strerror(error));
}

// Moves the pages of [from, from + length) to [to, to + length), replacing the fresh pages
// mapped there. mremap moves within one kernel mapping (VMA) only (kernels before 6.17): a
// range made of several - an arena that was itself coalesced - answers EFAULT and is moved
// in halves until each piece lies in one. A piece that cannot move is unmapped and `to`
// gets fresh pages again (mremap may have unmapped the target before it failed); false
// only when even that fails.
bool move_pages(std::uintptr_t from, std::uintptr_t to, std::size_t length) {
  void* const source = reinterpret_cast<void*>(from);
  void* const target = reinterpret_cast<void*>(to);
  if (::mremap(source, length, length, MREMAP_MAYMOVE | MREMAP_FIXED, target) != MAP_FAILED) {
    return true;
  }
  if (errno == EFAULT && length > HostResource::kPageSize) {
    const std::size_t half = round_up(length / 2, HostResource::kPageSize);
    const bool first = move_pages(from, to, half);
    const bool second = move_pages(from + half, to + half, length - half);
    return first && second;
  }
  ::munmap(source, length);
  return ::mmap(target, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1,
                0) != MAP_FAILED;
}

}  // namespace

bool move_host_pages(void* from, void* to, std::size_t length) {
  return length == 0 || move_pages(reinterpret_cast<std::uintptr_t>(from),
                                   reinterpret_cast<std::uintptr_t>(to), length);
}

// MADV_POPULATE_WRITE builds the page tables in one call (it reports ENOMEM as an error;
// older kernels answer EINVAL). A write to each page follows either way: in a virtual
// machine whose memory the host backs lazily (this project's build machines), populated
// guest pages still fault in the host on their first real write, at ~34 us per 4 KiB.
bool prefault_host_pages(void* base, std::size_t length) {
#ifdef MADV_POPULATE_WRITE
  if (::madvise(base, length, MADV_POPULATE_WRITE) != 0 && errno != EINVAL) return false;
#endif
  auto* bytes = static_cast<volatile unsigned char*>(base);
  for (std::size_t offset = 0; offset < length; offset += HostResource::kPageSize) {
    bytes[offset] = 0;
  }
  return true;
}

std::string HostResource::name() const {
  return options_.transparent_huge_pages ? "host(thp)" : "host";
}

void* HostResource::do_allocate(std::size_t bytes, Stream) {
  if (bytes == 0) return nullptr;
  return map(bytes, options_.populate);
}

void* HostResource::map(std::size_t bytes, bool populate) {
  const bool huge = options_.transparent_huge_pages;
  const std::size_t slack = huge ? kHugePageSize - kPageSize : 0;
  if (bytes > std::numeric_limits<std::size_t>::max() - kHugePageSize) {
    throw_out_of_memory(name(), bytes, "size too large to map", ENOMEM);
  }
  const std::size_t length = round_up(bytes, kPageSize);
  const std::size_t mapped = length + slack;

  // With THP, pages are populated after madvise so that they are faulted in as huge pages.
  int flags = MAP_PRIVATE | MAP_ANONYMOUS;
  if (populate && !huge) flags |= MAP_POPULATE;
  void* raw = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (raw == MAP_FAILED) throw_out_of_memory(name(), bytes, "mmap failed", errno);
  if (!huge) return raw;

  const auto start = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t aligned = round_up(start, kHugePageSize);
  const std::size_t head = aligned - start;
  const std::size_t tail = mapped - head - length;
  if (head != 0) ::munmap(raw, head);
  if (tail != 0) ::munmap(reinterpret_cast<void*>(aligned + length), tail);
  void* base = reinterpret_cast<void*>(aligned);
  // Advice only: a kernel without THP still gives a valid (4 KiB-backed) mapping.
  ::madvise(base, length, MADV_HUGEPAGE);
  if (populate && !prefault_host_pages(base, length)) {
    const int error = errno;
    ::munmap(base, length);
    throw_out_of_memory(name(), bytes, "populating pages failed", error);
  }
  return base;
}

void HostResource::do_deallocate(void* ptr, std::size_t bytes, Stream) {
  if (ptr == nullptr) return;
  ::munmap(ptr, round_up(bytes, kPageSize));
}

// The ranges go in their order, each at the next page (the next 2 MiB with THP, so huge
// pages move whole); a range that does not fit is cut, its tail unmapped. Only the part
// no range covered is populated when the options ask for it.
void* HostResource::do_coalesce(std::span<const ResourceRange> ranges, std::size_t bytes,
                                Stream stream) {
  void* base = nullptr;
  try {
    if (bytes != 0) base = map(bytes, /*populate=*/false);
  } catch (...) {
    for (const ResourceRange& range : ranges) do_deallocate(range.ptr, range.bytes, stream);
    throw;
  }
  const std::size_t length = bytes == 0 ? 0 : round_up(bytes, kPageSize);
  const auto start = reinterpret_cast<std::uintptr_t>(base);
  std::size_t offset = 0;
  bool moved_all = true;
  for (const ResourceRange& range : ranges) {
    if (range.ptr == nullptr) continue;
    const auto from = reinterpret_cast<std::uintptr_t>(range.ptr);
    const std::size_t size = round_up(range.bytes, kPageSize);
    if (options_.transparent_huge_pages) offset = std::min(round_up(offset, kHugePageSize), length);
    const std::size_t take = std::min(size, length - offset);
    if (take < size) ::munmap(reinterpret_cast<void*>(from + take), size - take);
    if (take == 0) continue;
    moved_all =
        move_host_pages(range.ptr, reinterpret_cast<void*>(start + offset), take) && moved_all;
    offset += take;
  }
  if (!moved_all) {
    ::munmap(base, length);
    throw_out_of_memory(name(), bytes, "moving pages into the new range failed", ENOMEM);
  }
  if (options_.populate && offset < length &&
      !prefault_host_pages(reinterpret_cast<void*>(start + offset), length - offset)) {
    const int error = errno;
    ::munmap(base, length);
    throw_out_of_memory(name(), bytes, "populating pages failed", error);
  }
  return base;
}

// Each part of a mapping is a mapping of its own: munmap and mremap take any whole pages
// (split() has checked that the cut is a page boundary inside the range).
bool HostResource::do_split(void* /*ptr*/, std::size_t /*bytes*/, std::size_t /*first*/) {
  return true;
}

}  // namespace sdalloc
