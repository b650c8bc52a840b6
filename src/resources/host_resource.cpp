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
#include <mutex>
#include <new>
#include <string>

#include "core/bits.hpp"
#include "resources/page_table_move.hpp"
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
// mapped there, piece by kernel mapping (move_by_mapping). A piece that cannot move is
// unmapped and `to` gets fresh pages again (mremap may have unmapped the target before it
// failed); false only when even that fails.
bool move_pages(std::uintptr_t from, std::uintptr_t to, std::size_t length) {
  const auto move = [](std::uintptr_t source, std::uintptr_t target, std::size_t bytes) {
    return ::mremap(reinterpret_cast<void*>(source), bytes, bytes, MREMAP_MAYMOVE | MREMAP_FIXED,
                    reinterpret_cast<void*>(target)) == MAP_FAILED
               ? errno
               : 0;
  };
  const auto refused = [](std::uintptr_t source, std::uintptr_t target, std::size_t bytes) {
    ::munmap(reinterpret_cast<void*>(source), bytes);
    return ::mmap(reinterpret_cast<void*>(target), bytes, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != MAP_FAILED;
  };
  return detail::move_by_mapping(from, to, length, HostResource::kPageSize, move, refused);
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
  if (bytes > (std::numeric_limits<std::size_t>::max() - kHugePageSize) / 2) {
    throw_out_of_memory(name(), bytes, "size too large to map", ENOMEM);
  }
  const std::size_t length = round_up(bytes, kPageSize);
  const std::size_t room = options_.growth_room ? length : 0;
  int flags = MAP_PRIVATE | MAP_ANONYMOUS;
  // With THP, pages are populated after madvise so that they are faulted in as huge pages.
  if (populate && !huge) flags |= MAP_POPULATE;
  if (slack == 0 && room == 0) {
    void* raw = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (raw == MAP_FAILED) throw_out_of_memory(name(), bytes, "mmap failed", errno);
    return raw;
  }

  // Address space first (no memory, no commit charge), then the range mapped over its
  // aligned start; what follows the range is its room (or, without one, unmapped).
  const std::size_t reserved = length + slack + room;
  void* raw =
      ::mmap(nullptr, reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED)
    throw_out_of_memory(name(), bytes, "reserving address space failed", errno);
  const auto start = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t aligned = huge ? round_up(start, kHugePageSize) : start;
  void* base = ::mmap(reinterpret_cast<void*>(aligned), length, PROT_READ | PROT_WRITE,
                      flags | MAP_FIXED, -1, 0);
  if (base == MAP_FAILED) {
    const int error = errno;
    ::munmap(raw, reserved);
    throw_out_of_memory(name(), bytes, "mmap failed", error);
  }
  if (aligned != start) ::munmap(raw, aligned - start);
  const std::uintptr_t room_start = aligned + length;
  const std::size_t room_bytes = start + reserved - room_start;
  bool kept_room = false;
  if (room != 0) {
    try {
      const std::lock_guard lock(rooms_mutex_);
      rooms_.emplace(room_start, room_bytes);
      kept_room = true;
    } catch (const std::bad_alloc&) {  // NOLINT(bugprone-empty-catch): a range without room
    }
  }
  if (!kept_room) ::munmap(reinterpret_cast<void*>(room_start), room_bytes);
  if (!huge) return base;

  // Advice only: a kernel without THP still gives a valid (4 KiB-backed) mapping.
  ::madvise(base, length, MADV_HUGEPAGE);
  if (populate && !prefault_host_pages(base, length)) {
    const int error = errno;
    ::munmap(base, length);
    drop_room(room_start);
    throw_out_of_memory(name(), bytes, "populating pages failed", error);
  }
  return base;
}

HostResource::~HostResource() {
  for (const auto& [start, bytes] : rooms_) ::munmap(reinterpret_cast<void*>(start), bytes);
}

void HostResource::drop_room(std::uintptr_t end) {
  if (!options_.growth_room) return;
  std::size_t bytes = 0;
  {
    const std::lock_guard lock(rooms_mutex_);
    const auto it = rooms_.find(end);
    if (it == rooms_.end()) return;
    bytes = it->second;
    rooms_.erase(it);
  }
  ::munmap(reinterpret_cast<void*>(end), bytes);
}

bool HostResource::claim_room(std::uintptr_t end, std::size_t bytes) {
  const std::lock_guard lock(rooms_mutex_);
  const auto it = rooms_.find(end);
  if (it == rooms_.end() || it->second < bytes) return false;
  auto node = rooms_.extract(it);  // re-keyed in place: no allocation, so no failure
  if (node.mapped() > bytes) {
    node.key() = end + bytes;
    node.mapped() -= bytes;
    rooms_.insert(std::move(node));
  }
  return true;
}

void HostResource::do_deallocate(void* ptr, std::size_t bytes, Stream) {
  if (ptr == nullptr) return;
  const std::size_t length = round_up(bytes, kPageSize);
  ::munmap(ptr, length);
  drop_room(reinterpret_cast<std::uintptr_t>(ptr) + length);
}

// The ranges go in their order, each at the next page (the next 2 MiB with THP, so huge
// pages move whole); a range that does not fit is cut, its tail unmapped, and every range's
// room goes with it. Answers the bytes the ranges cover; moved_all false if a move failed.
std::size_t HostResource::move_in(std::span<const ResourceRange> ranges, std::uintptr_t start,
                                  std::size_t length, bool& moved_all) {
  std::size_t offset = 0;
  for (const ResourceRange& range : ranges) {
    if (range.ptr == nullptr) continue;
    const auto from = reinterpret_cast<std::uintptr_t>(range.ptr);
    const std::size_t size = round_up(range.bytes, kPageSize);
    if (options_.transparent_huge_pages) offset = std::min(round_up(offset, kHugePageSize), length);
    const std::size_t take = std::min(size, length - offset);
    if (take < size) ::munmap(reinterpret_cast<void*>(from + take), size - take);
    drop_room(from + size);
    if (take == 0) continue;
    moved_all =
        move_host_pages(range.ptr, reinterpret_cast<void*>(start + offset), take) && moved_all;
    offset += take;
  }
  return offset;
}

// Only the part no range covered is populated when the options ask for it.
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
  bool moved_all = true;
  const std::size_t offset = move_in(ranges, start, length, moved_all);
  if (!moved_all) {
    do_deallocate(base, length, stream);
    throw_out_of_memory(name(), bytes, "moving pages into the new range failed", ENOMEM);
  }
  if (options_.populate && offset < length &&
      !prefault_host_pages(reinterpret_cast<void*>(start + offset), length - offset)) {
    const int error = errno;
    do_deallocate(base, length, stream);
    throw_out_of_memory(name(), bytes, "populating pages failed", error);
  }
  return base;
}

// Each part of a mapping is a mapping of its own: munmap and mremap take any whole pages
// (split() has checked that the cut is a page boundary inside the range).
bool HostResource::do_split(void* /*ptr*/, std::size_t /*bytes*/, std::size_t /*first*/) {
  return true;
}

// The new part is mapped over the room with fresh pages, and the donors' pages are moved
// over its front in their order (as in coalesce); a donor that does not fit is cut.
bool HostResource::do_grow(void* ptr, std::size_t bytes, std::size_t new_bytes,
                           std::span<const ResourceRange> donors, Stream stream) {
  const auto start = reinterpret_cast<std::uintptr_t>(ptr);
  const std::size_t length = round_up(bytes, kPageSize);
  const std::size_t new_length = round_up(new_bytes, kPageSize);
  const auto return_donors = [&] {
    for (const ResourceRange& range : donors) do_deallocate(range.ptr, range.bytes, stream);
  };
  if (new_length == length) {  // the pages it has cover it already
    return_donors();
    return true;
  }
  const std::size_t extra = new_length - length;
  const std::uintptr_t end = start + length;
  if (!options_.growth_room || !claim_room(end, extra)) return false;
  auto* const target = reinterpret_cast<void*>(end);
  // A failed MAP_FIXED may have unmapped the room already: what is left of it goes too.
  const auto give_up = [&](const char* what, int error) {
    ::munmap(target, extra);
    drop_room(end + extra);
    throw_out_of_memory(name(), new_bytes, what, error);
  };
  if (::mmap(target, extra, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1,
             0) == MAP_FAILED) {
    const int error = errno;
    return_donors();
    give_up("mapping the grown part failed", error);
  }
  bool moved_all = true;
  const std::size_t offset = move_in(donors, end, extra, moved_all);
  if (!moved_all) give_up("moving pages into the grown part failed", ENOMEM);
  if (options_.populate && offset < extra &&
      !prefault_host_pages(reinterpret_cast<void*>(end + offset), extra - offset)) {
    give_up("populating pages failed", errno);
  }
  return true;
}

}  // namespace sdalloc
