// host_resource.cpp - anonymous private mappings straight from the kernel.
//
// Every segment is its own mapping, so deallocate returns it to the system at once. With
// transparent huge pages the mapping must start on a 2 MiB boundary for the kernel to back
// it with huge pages; mmap only promises 4 KiB, so we map 2 MiB - 4 KiB more than needed and
// unmap the unaligned head and the tail. deallocate then unmaps exactly the kept range.
#include "sdalloc/resources/host_resource.hpp"

#include <sys/mman.h>

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

}  // namespace

// MADV_POPULATE_WRITE builds the page tables in one call (it reports ENOMEM as an error;
// older kernels answer EINVAL). A write to each page follows either way: in a virtual
// machine whose memory the host backs lazily (this project's build machines), populated
// guest pages still fault in the host on their first real write.
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
  const bool huge = options_.transparent_huge_pages;
  if (bytes > std::numeric_limits<std::size_t>::max() - kHugePageSize) {
    throw_out_of_memory(name(), bytes, "size too large to map", ENOMEM);
  }
  const std::size_t length = round_up(bytes, kPageSize);
  int flags = MAP_PRIVATE | MAP_ANONYMOUS;
  // With THP, pages are populated after madvise so that they are faulted in as huge pages.
  if (options_.populate && !huge) flags |= MAP_POPULATE;
  if (!huge) {
    void* raw = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (raw == MAP_FAILED) throw_out_of_memory(name(), bytes, "mmap failed", errno);
    return raw;
  }
  const std::size_t slack = kHugePageSize - kPageSize;
  void* raw = ::mmap(nullptr, length + slack, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (raw == MAP_FAILED) throw_out_of_memory(name(), bytes, "mmap failed", errno);
  const auto start = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t aligned = round_up(start, kHugePageSize);
  if (aligned != start) ::munmap(raw, aligned - start);
  const std::uintptr_t end = aligned + length;
  if (start + length + slack != end) {
    ::munmap(reinterpret_cast<void*>(end), start + length + slack - end);
  }
  void* base = reinterpret_cast<void*>(aligned);
  // Advice only: a kernel without THP still gives a valid (4 KiB-backed) mapping.
  ::madvise(base, length, MADV_HUGEPAGE);
  if (options_.populate && !prefault_host_pages(base, length)) {
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

}  // namespace sdalloc
