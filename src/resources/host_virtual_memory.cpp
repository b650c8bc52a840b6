// host_virtual_memory.cpp - reserved ranges, memfd chunks and MAP_FIXED mappings.
//
// Tables (under mutex_): the ledger of reserved ranges, mappings and chunks shared with the
// CUDA driver's implementation (virtual_memory_ledger.hpp), and the memfd's free extents by
// size. Every call is checked against the tables first; a map then claims its mapping
// before the system call (so a concurrent misuse is caught too; the mapping counts in
// mapped_bytes() from then) and gives it back if the call fails.
#include "sdalloc/resources/host_virtual_memory.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "core/bits.hpp"
#include "resources/page_table_move.hpp"
#include "resources/virtual_memory_ledger.hpp"
#include "sdalloc/core/errors.hpp"

namespace sdalloc {

namespace {

std::string hex(std::uintptr_t value) {
  char text[32];
  std::snprintf(text, sizeof text, "0x%zx", static_cast<std::size_t>(value));
  return text;
}

std::string system_error(const char* call, int error) {
  return std::string(call) + " failed: " + std::strerror(error);
}

// Makes [address, address + bytes) reserved address space again (PROT_NONE over whatever
// is mapped there) in one step: never a hole another thread's mmap could land in.
bool reserve_again(void* address, std::size_t bytes) {
  return ::mmap(address, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
                -1, 0) != MAP_FAILED;
}

// A mapping call the system refused: OutOfMemory for ENOMEM (no memory for page tables or
// kernel mappings), Error otherwise.
[[noreturn]] void throw_refused(const std::string& name, const std::string& what, int error,
                                std::size_t requested) {
  if (error == ENOMEM) {
    OutOfMemoryInfo info;
    info.requested = requested;
    throw OutOfMemory::describe(name, info, what);
  }
  throw Error(name + ": " + what);
}

// Moves the mapping [from, from + bytes) (one kernel mapping) to `to`, page tables and all,
// and makes `from` reserved space again. Answers 0 or the errno of the refused mremap, in
// which case nothing moved.
int move_mapping(void* from, void* to, std::size_t bytes) {
  if (const int error = detail::move_with_page_tables(from, to, bytes); error != 0) return error;
  // Should the system refuse to make `from` reserved space again, the empty mapping stays until
  // the next map there or the range's release (only a use after free could touch it, and
  // it would see the same pages).
  (void)reserve_again(from, bytes);
  return 0;
}

// Whether mremap with MREMAP_DONTUNMAP moves a shared mapping here (Linux 5.13): tried once
// on a page of a scratch memfd.
bool can_move_shared_mappings() {
  const int fd = ::memfd_create("sdalloc-vm-probe", MFD_CLOEXEC);
  if (fd < 0) return false;
  bool works = false;
  constexpr std::size_t kPage = 4096;
  void* area =
      ::mmap(nullptr, 2 * kPage, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (area != MAP_FAILED) {
    char* first = static_cast<char*>(area);
    if (::ftruncate(fd, kPage) == 0 &&
        ::mmap(first, kPage, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) != MAP_FAILED) {
      works = move_mapping(first, first + kPage, kPage) == 0;
    }
    ::munmap(area, 2 * kPage);
  }
  ::close(fd);
  return works;
}

// The memfd grows in steps of at least this much (it is sparse: size costs nothing).
constexpr std::uint64_t kFileGrowth = std::uint64_t{1} << 30;

// RAM + swap: no more memfd pages than this can ever exist at once. 0 when unknown.
std::size_t machine_bytes() {
  struct sysinfo info {};
  if (::sysinfo(&info) != 0) return 0;
  const auto unit = static_cast<std::size_t>(info.mem_unit == 0 ? 1 : info.mem_unit);
  const std::size_t pages = static_cast<std::size_t>(info.totalram) + info.totalswap;
  return pages > std::numeric_limits<std::size_t>::max() / unit ? 0 : pages * unit;
}

}  // namespace

struct HostVirtualMemory::Tables {
  detail::VirtualMemoryLedger ledger;  // chunk handles are file offsets
  // Holes by (bytes, file offset): a create takes the lowest offset of its size, so chunks
  // created one after another tend to be adjacent in the file, and a caller that maps them
  // at adjacent addresses in that order gets one kernel mapping for all of them.
  std::set<std::pair<std::size_t, std::uint64_t>> free_extents;
  std::uint64_t file_end = 0;   // extents below were handed out at some point
  std::uint64_t file_size = 0;  // ftruncate'd size
};

HostVirtualMemory::HostVirtualMemory(HostVirtualMemoryOptions options)
    : options_(options), machine_bytes_(machine_bytes()), tables_(std::make_unique<Tables>()) {
  if (options_.physical_limit % kPageSize != 0) {
    throw InvalidArgument("HostVirtualMemory: physical_limit must be a multiple of 4096, got " +
                          std::to_string(options_.physical_limit));
  }
  fd_ = ::memfd_create("sdalloc-vm", MFD_CLOEXEC);
  if (fd_ < 0) throw Error("HostVirtualMemory: " + system_error("memfd_create", errno));
  moves_ = options_.move_mappings && can_move_shared_mappings();
}

HostVirtualMemory::~HostVirtualMemory() {
  // Whatever the caller left: unmapping a whole range removes its mappings too.
  for (const auto& [base, bytes] : tables_->ledger.ranges()) {
    ::munmap(reinterpret_cast<void*>(base), bytes);
  }
  ::close(fd_);
}

std::string HostVirtualMemory::name() const {
  std::string text = "host-vm(memfd";
  if (options_.physical_limit != 0) text += ", " + format_size(options_.physical_limit);
  if (options_.populate) text += ", populate";
  return text + ")";
}

// ---------------------------------------------------------------------------------------
// address ranges

void* HostVirtualMemory::reserve(std::size_t bytes, std::size_t alignment) {
  if (bytes == 0 || bytes % kPageSize != 0) {
    throw InvalidArgument(name() + ": reserve of " + std::to_string(bytes) +
                          " bytes: the size must be a positive multiple of 4096");
  }
  if (alignment != 0 && !is_power_of_two(alignment)) {
    throw InvalidArgument(name() + ": reserve alignment must be 0 or a power of two, got " +
                          std::to_string(alignment));
  }
  const std::size_t align = alignment > kPageSize ? alignment : kPageSize;
  const std::size_t slack = align - kPageSize;
  if (bytes > std::numeric_limits<std::size_t>::max() / 2 - slack) {
    OutOfMemoryInfo info;
    info.requested = bytes;
    throw OutOfMemory::describe(name(), info, "address range too large to reserve");
  }
  void* raw =
      ::mmap(nullptr, bytes + slack, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) {
    const int error = errno;
    OutOfMemoryInfo info;
    info.requested = bytes;
    throw OutOfMemory::describe(name(), info,
                                "reserving address space: " + system_error("mmap", error));
  }
  const auto start = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t base = (start + align - 1) & ~(static_cast<std::uintptr_t>(align) - 1);
  if (base != start) ::munmap(raw, base - start);
  if (const std::size_t tail = slack - (base - start); tail != 0) {
    ::munmap(reinterpret_cast<void*>(base + bytes), tail);
  }
  try {
    std::lock_guard lock(mutex_);
    tables_->ledger.add_range(base, bytes);
  } catch (...) {
    ::munmap(reinterpret_cast<void*>(base), bytes);
    throw;
  }
  return reinterpret_cast<void*>(base);
}

void HostVirtualMemory::release(void* base, std::size_t bytes) {
  const auto addr = reinterpret_cast<std::uintptr_t>(base);
  {
    std::lock_guard lock(mutex_);
    detail::VirtualMemoryLedger& ledger = tables_->ledger;
    if (!ledger.is_range(addr, bytes)) {
      throw InvalidArgument(name() + ": release of " + hex(addr) + " (" + format_bytes(bytes) +
                            "), which is not a range reserved here");
    }
    if (ledger.overlaps_mapping(addr, bytes)) {
      throw InvalidArgument(name() + ": release of the range at " + hex(addr) +
                            " while chunks are still mapped in it");
    }
    ledger.remove_range(addr);
  }
  ::munmap(base, bytes);
}

// ---------------------------------------------------------------------------------------
// physical chunks

PhysicalChunk HostVirtualMemory::create(std::size_t bytes) {
  if (bytes == 0 || bytes % kPageSize != 0) {
    throw InvalidArgument(name() + ": create of " + std::to_string(bytes) +
                          " bytes: the size must be a positive multiple of 4096");
  }
  std::lock_guard lock(mutex_);
  Tables& t = *tables_;
  const std::size_t physical = t.ledger.physical_bytes();
  if (options_.physical_limit != 0 && bytes > options_.physical_limit - physical) {
    OutOfMemoryInfo info;
    info.requested = bytes;
    info.reserved = physical;
    info.capacity = options_.physical_limit;
    throw OutOfMemory::describe(name(), info,
                                format_bytes(physical) + " of physical memory in chunks, " +
                                    format_bytes(options_.physical_limit - physical) +
                                    " available");
  }
  std::uint64_t offset = 0;
  if (auto hole = t.free_extents.lower_bound({bytes, 0});
      hole != t.free_extents.end() && hole->first == bytes) {
    offset = hole->second;  // punched out when destroyed: reads as zeros
    t.ledger.add_chunk(offset, bytes);
    t.free_extents.erase(hole);
  } else {
    offset = t.file_end;
    if (offset + bytes > t.file_size) {
      const std::uint64_t size = std::max(offset + bytes, t.file_size + kFileGrowth);
      if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) {
        const int error = errno;
        OutOfMemoryInfo info;
        info.requested = bytes;
        info.reserved = physical;
        info.capacity = options_.physical_limit;
        throw OutOfMemory::describe(name(), info,
                                    "growing the memfd: " + system_error("ftruncate", error));
      }
      t.file_size = size;
    }
    t.ledger.add_chunk(offset, bytes);
    t.file_end += bytes;
  }
  return PhysicalChunk{offset, bytes};
}

void HostVirtualMemory::destroy(PhysicalChunk chunk) {
  std::lock_guard lock(mutex_);
  Tables& t = *tables_;
  const detail::VirtualMemoryLedger::Chunk* found = t.ledger.find_chunk(chunk.handle, chunk.bytes);
  if (found == nullptr) {
    throw InvalidArgument(name() + ": destroy of chunk " + std::to_string(chunk.handle) + " (" +
                          format_bytes(chunk.bytes) + "), which is not a chunk created here");
  }
  if (found->mapped) {
    throw InvalidArgument(name() + ": destroy of chunk " + std::to_string(chunk.handle) +
                          " while it is mapped");
  }
  // Frees the pages; the extent reads as zeros again and is reused by a create.
  if (::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(chunk.handle),
                  static_cast<off_t>(chunk.bytes)) != 0) {
    const int error = errno;
    t.ledger.remove_chunk(chunk.handle);  // lost: its pages stay in the file until the object dies
    throw Error(name() + ": destroy of chunk " + std::to_string(chunk.handle) + ": " +
                system_error("fallocate(PUNCH_HOLE)", error));
  }
  t.ledger.remove_chunk(chunk.handle);
  t.free_extents.emplace(chunk.bytes, chunk.handle);
}

// ---------------------------------------------------------------------------------------
// mappings

void HostVirtualMemory::map(void* address, PhysicalChunk chunk) {
  const auto addr = reinterpret_cast<std::uintptr_t>(address);
  Tables& t = *tables_;
  bool again = false;
  {
    std::lock_guard lock(mutex_);
    const detail::VirtualMemoryLedger::Chunk* found =
        t.ledger.find_chunk(chunk.handle, chunk.bytes);
    if (found == nullptr) {
      throw InvalidArgument(name() + ": map of chunk " + std::to_string(chunk.handle) + " (" +
                            format_bytes(chunk.bytes) + "), which is not a chunk created here");
    }
    if (found->mapped) {
      throw InvalidArgument(name() + ": map of chunk " + std::to_string(chunk.handle) +
                            ", which is already mapped");
    }
    if (addr % kPageSize != 0 ||
        t.ledger.range_holding(addr, chunk.bytes) == t.ledger.ranges().end()) {
      throw InvalidArgument(name() + ": map at " + hex(addr) + " of " + format_bytes(chunk.bytes) +
                            ": not a page-aligned place inside a reserved range");
    }
    if (t.ledger.overlaps_mapping(addr, chunk.bytes)) {
      throw InvalidArgument(name() + ": map at " + hex(addr) + " of " + format_bytes(chunk.bytes) +
                            " overlaps a mapping");
    }
    again = found->was_mapped;
    t.ledger.add_mapping(addr, chunk.handle, chunk.bytes);  // claimed
  }
  // A chunk mapped before is a page moving (VirtualMemoryPool's stitching): its pages were
  // most likely written where it was, so building its page tables in the call costs no
  // memory and saves a fault per 4 KiB when it is used here.
  int flags = MAP_SHARED | MAP_FIXED;
  if (options_.populate || again) flags |= MAP_POPULATE;
  void* result = ::mmap(address, chunk.bytes, PROT_READ | PROT_WRITE, flags, fd_,
                        static_cast<off_t>(chunk.handle));
  if (result == MAP_FAILED) {
    const int error = errno;
    // A failed MAP_FIXED may have removed the reservation underneath: restore it.
    (void)reserve_again(address, chunk.bytes);
    std::lock_guard lock(mutex_);
    t.ledger.remove_mapping(addr);
    throw_refused(name(),
                  "map at " + hex(addr) + " of " + format_bytes(chunk.bytes) + ": " +
                      system_error("mmap", error),
                  error, chunk.bytes);
  }
}

void HostVirtualMemory::unmap(void* address, std::size_t bytes, Stream) {
  const auto addr = reinterpret_cast<std::uintptr_t>(address);
  Tables& t = *tables_;
  {
    std::lock_guard lock(mutex_);
    if (t.ledger.find_mapping(addr, bytes) == nullptr) {
      throw InvalidArgument(name() + ": unmap at " + hex(addr) + " of " + format_bytes(bytes) +
                            ", which is not a mapping made here");
    }
  }
  if (!reserve_again(address, bytes)) {
    throw Error(name() + ": unmap at " + hex(addr) + " of " + format_bytes(bytes) + ": " +
                system_error("mmap(PROT_NONE)", errno));
  }
  std::lock_guard lock(mutex_);
  t.ledger.remove_mapping(addr);
}

void HostVirtualMemory::move(void* from, void* to, const PhysicalChunk* chunks, std::size_t count,
                             Stream) {
  if (!moves_) {
    throw InvalidArgument(name() + ": move is not supported here (" +
                          (options_.move_mappings ? "Linux before 5.13" : "move_mappings is off") +
                          ")");
  }
  if (count == 0) return;
  if (chunks == nullptr) {
    throw InvalidArgument(name() + ": move of " + std::to_string(count) +
                          " chunks without the chunks");
  }
  const auto src = reinterpret_cast<std::uintptr_t>(from);
  const auto dst = reinterpret_cast<std::uintptr_t>(to);
  Tables& t = *tables_;
  std::size_t total = 0;
  {
    std::lock_guard lock(mutex_);
    for (std::size_t i = 0; i < count; ++i) {
      const detail::VirtualMemoryLedger::Mapping* m =
          t.ledger.find_mapping(src + total, chunks[i].bytes);
      if (m == nullptr || m->chunk != chunks[i].handle) {
        throw InvalidArgument(name() + ": move of chunk " + std::to_string(chunks[i].handle) +
                              " (" + format_bytes(chunks[i].bytes) + ") from " + hex(src + total) +
                              ", which is not where map() put it");
      }
      total += chunks[i].bytes;
    }
    if (dst % kPageSize != 0 || t.ledger.range_holding(dst, total) == t.ledger.ranges().end()) {
      throw InvalidArgument(name() + ": move to " + hex(dst) + " of " + format_bytes(total) +
                            ": not a page-aligned place inside a reserved range");
    }
    if (t.ledger.overlaps_mapping(dst, total)) {  // the chunks' own places included
      throw InvalidArgument(name() + ": move to " + hex(dst) + " of " + format_bytes(total) +
                            " overlaps a mapping");
    }
    // Claimed: from here the tables show the chunks at their new places.
    for (std::size_t i = 0, offset = 0; i < count; offset += chunks[i++].bytes) {
      t.ledger.move_mapping(src + offset, dst + offset);
    }
  }
  // One mremap per run of chunks whose extents follow each other (one kernel mapping, as
  // map() made it where they were mapped in that order).
  const auto run_end = [&](std::size_t i, std::size_t& bytes) {
    bytes = chunks[i].bytes;
    for (++i; i < count && chunks[i].handle == chunks[i - 1].handle + chunks[i - 1].bytes; ++i) {
      bytes += chunks[i].bytes;
    }
    return i;
  };
  const auto at = [](std::uintptr_t base, std::size_t offset) {
    return reinterpret_cast<void*>(base + offset);
  };
  std::size_t moved = 0;  // bytes from the start, in whole runs
  for (std::size_t i = 0; i < count;) {
    std::size_t bytes = 0;
    const std::size_t next = run_end(i, bytes);
    if (const int error = move_mapping(at(src, moved), at(dst, moved), bytes); error != 0) {
      // Back where they were, run by run; a run the system will not move back either stays
      // at its new place, and the tables say so (both refusals in a row: no memory left
      // for kernel mappings at all).
      std::size_t stuck = 0;
      std::lock_guard lock(mutex_);
      for (std::size_t k = 0, offset = 0; k < count;) {
        std::size_t back = 0;
        const std::size_t after = run_end(k, back);
        if (offset < moved && move_mapping(at(dst, offset), at(src, offset), back) != 0) {
          stuck += back;
          offset += back;
          k = after;
          continue;
        }
        for (; k < after; offset += chunks[k++].bytes) {
          t.ledger.move_mapping(dst + offset, src + offset);
        }
      }
      const std::string what = "move from " + hex(src) + " to " + hex(dst) + " of " +
                               format_bytes(total) + ": " + system_error("mremap", error);
      if (stuck != 0) {
        throw Error(name() + ": " + what + "; " + format_bytes(stuck) +
                    " moved before could not move back and stay at the new place");
      }
      throw_refused(name(), what, error, total);
    }
    moved += bytes;
    i = next;
  }
}

// ---------------------------------------------------------------------------------------
// figures

std::size_t HostVirtualMemory::physical_bytes() const {
  std::lock_guard lock(mutex_);
  return tables_->ledger.physical_bytes();
}

std::size_t HostVirtualMemory::mapped_bytes() const {
  std::lock_guard lock(mutex_);
  return tables_->ledger.mapped_bytes();
}

std::size_t HostVirtualMemory::reserved_bytes() const {
  std::lock_guard lock(mutex_);
  return tables_->ledger.reserved_bytes();
}

}  // namespace sdalloc
