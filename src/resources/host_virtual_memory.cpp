// host_virtual_memory.cpp - reserved ranges, chunks of anonymous pages, MAP_FIXED mappings.
//
// Tables (under mutex_): the ledger of reserved ranges, mappings and chunks shared with the
// CUDA driver's implementation (virtual_memory_ledger.hpp). Every call is checked against
// the tables first; a map then claims its mapping before the system call (so a concurrent
// misuse is caught too; the mapping counts in mapped_bytes() from then) and gives it back if
// the call fails.
#include "sdalloc/resources/host_virtual_memory.hpp"

#include <sys/mman.h>
#include <sys/sysinfo.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

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

// RAM + swap: no more pages than this can ever exist at once. 0 when unknown.
std::size_t machine_bytes() {
  struct sysinfo info {};
  if (::sysinfo(&info) != 0) return 0;
  const auto unit = static_cast<std::size_t>(info.mem_unit == 0 ? 1 : info.mem_unit);
  const std::size_t pages = static_cast<std::size_t>(info.totalram) + info.totalswap;
  return pages > std::numeric_limits<std::size_t>::max() / unit ? 0 : pages * unit;
}

// What breaks the rules if `chunk` is mapped at `at` (virtual_memory.hpp), or "".
std::string map_problem(const detail::VirtualMemoryLedger& ledger, std::uintptr_t at,
                        PhysicalChunk chunk) {
  const detail::VirtualMemoryLedger::Chunk* found = ledger.find_chunk(chunk.handle, chunk.bytes);
  if (found == nullptr) {
    return "map of chunk " + std::to_string(chunk.handle) + " (" + format_bytes(chunk.bytes) +
           "), which is not a chunk created here";
  }
  if (found->mapped) {
    return "map of chunk " + std::to_string(chunk.handle) + ", which is already mapped";
  }
  if (at % HostVirtualMemory::kPageSize != 0 ||
      ledger.range_holding(at, chunk.bytes) == ledger.ranges().end()) {
    return "map at " + hex(at) + " of " + format_bytes(chunk.bytes) +
           ": not a page-aligned place inside a reserved range";
  }
  if (ledger.overlaps_mapping(at, chunk.bytes)) {
    return "map at " + hex(at) + " of " + format_bytes(chunk.bytes) + " overlaps a mapping";
  }
  return {};
}

}  // namespace

struct HostVirtualMemory::Tables {
  detail::VirtualMemoryLedger ledger;
  // The next chunk's handle: the bytes of all chunks created before it, so chunks created one
  // after another have handles that follow each other (handle + bytes), as the interface
  // suggests for chunks that are cheaper to move together.
  std::uint64_t next_handle = 0;
};

HostVirtualMemory::HostVirtualMemory(HostVirtualMemoryOptions options)
    : options_(options), machine_bytes_(machine_bytes()), tables_(std::make_unique<Tables>()) {
  if (options_.physical_limit % kPageSize != 0) {
    throw InvalidArgument("HostVirtualMemory: physical_limit must be a multiple of 4096, got " +
                          std::to_string(options_.physical_limit));
  }
  moves_ = options_.move_mappings && detail::can_move_private_pages();
}

HostVirtualMemory::~HostVirtualMemory() {
  // Whatever the caller left: unmapping a whole range removes its mappings too.
  for (const auto& [base, bytes] : tables_->ledger.ranges()) {
    ::munmap(reinterpret_cast<void*>(base), bytes);
  }
}

std::string HostVirtualMemory::name() const {
  std::string text = "host-vm(anonymous";
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
  // No memory yet: a chunk's pages exist once written where it is mapped.
  const std::uint64_t handle = t.next_handle;
  t.ledger.add_chunk(handle, bytes);
  t.next_handle += bytes;
  return PhysicalChunk{handle, bytes};
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
  // Unmapped, it holds no pages: only the figure goes.
  t.ledger.remove_chunk(chunk.handle);
}

// ---------------------------------------------------------------------------------------
// mappings

void HostVirtualMemory::map(void* address, PhysicalChunk chunk) { map_run(address, &chunk, 1); }

void HostVirtualMemory::map_run(void* address, const PhysicalChunk* chunks, std::size_t count) {
  if (count == 0) return;
  if (chunks == nullptr) {
    throw InvalidArgument(name() + ": map_run of " + std::to_string(count) +
                          " chunks without the chunks");
  }
  const auto addr = reinterpret_cast<std::uintptr_t>(address);
  Tables& t = *tables_;
  // Gives back the first `claimed` mappings of the run (the caller holds mutex_).
  const auto unclaim = [&](std::size_t claimed) {
    for (std::size_t i = 0, at = 0; i < claimed; at += chunks[i++].bytes) {
      t.ledger.remove_mapping(addr + at);
    }
  };
  std::size_t total = 0;
  {
    std::lock_guard lock(mutex_);
    std::size_t claimed = 0;  // mappings recorded so far, undone if a later chunk is refused
    try {
      for (; claimed < count; total += chunks[claimed++].bytes) {
        const std::string problem = map_problem(t.ledger, addr + total, chunks[claimed]);
        if (!problem.empty()) throw InvalidArgument(name() + ": " + problem);
        t.ledger.add_mapping(addr + total, chunks[claimed].handle, chunks[claimed].bytes);
      }
    } catch (...) {
      unclaim(claimed);
      throw;
    }
  }
  // Fresh zero pages, faulted in where they are first written. MAP_NORESERVE: like the
  // address space around them, they are not charged to the system's commit limit before
  // they exist.
  int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED;
  if (options_.populate) flags |= MAP_POPULATE;
  if (::mmap(address, total, PROT_READ | PROT_WRITE, flags, -1, 0) == MAP_FAILED) {
    const int error = errno;
    // A failed MAP_FIXED may have removed the reservation underneath: restore it.
    (void)reserve_again(address, total);
    std::lock_guard lock(mutex_);
    unclaim(count);
    throw_refused(
        name(),
        "map at " + hex(addr) + " of " + format_bytes(total) + ": " + system_error("mmap", error),
        error, total);
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
  // Its pages are freed: mapped again, the chunk reads as zeros.
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
  // Pieces moved (offset from the start, bytes), and those that would not move back: sized
  // before anything is claimed, so nothing after the claim allocates.
  std::vector<std::pair<std::size_t, std::size_t>> pieces;
  std::vector<std::pair<std::size_t, std::size_t>> stuck;
  pieces.reserve(count);
  stuck.reserve(count);
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
  // One mremap per run of chunks whose handles follow each other: created one after another
  // and mapped side by side in that order, they are one kernel mapping.
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
  int error = 0;
  for (std::size_t i = 0, offset = 0; i < count && error == 0;) {
    std::size_t bytes = 0;
    const std::size_t next = run_end(i, bytes);
    error = move_mapping(at(src, offset), at(dst, offset), bytes);
    if (error == 0) {
      pieces.emplace_back(offset, bytes);
      offset += bytes;
      i = next;
      continue;
    }
    if (next - i == 1) break;
    // A run may still be several kernel mappings (the kernel keeps pages moved before in
    // mappings of their own), which mremap refuses before Linux 6.17: chunk by chunk then,
    // each one mapping. Any other refusal is met again by the chunk that causes it.
    error = 0;
    for (; i < next && error == 0; ++i) {
      error = move_mapping(at(src, offset), at(dst, offset), chunks[i].bytes);
      if (error == 0) {
        pieces.emplace_back(offset, chunks[i].bytes);
        offset += chunks[i].bytes;
      }
    }
  }
  if (error == 0) return;
  // Back where they were, piece by piece; a piece the system will not move back either stays
  // at its new place, and the tables say so (both refusals in a row: no memory left for
  // kernel mappings at all).
  for (std::size_t k = pieces.size(); k-- > 0;) {
    const auto [offset, bytes] = pieces[k];
    if (move_mapping(at(dst, offset), at(src, offset), bytes) != 0) stuck.push_back(pieces[k]);
  }
  std::size_t stuck_bytes = 0;
  {
    std::lock_guard lock(mutex_);
    for (std::size_t k = 0, offset = 0; k < count; offset += chunks[k++].bytes) {
      const bool stays = std::any_of(stuck.begin(), stuck.end(), [&](const auto& piece) {
        return offset >= piece.first && offset < piece.first + piece.second;
      });
      if (stays) {
        stuck_bytes += chunks[k].bytes;
      } else {
        t.ledger.move_mapping(dst + offset, src + offset);
      }
    }
  }
  const std::string what = "move from " + hex(src) + " to " + hex(dst) + " of " +
                           format_bytes(total) + ": " + system_error("mremap", error);
  if (stuck_bytes != 0) {
    throw Error(name() + ": " + what + "; " + format_bytes(stuck_bytes) +
                " moved before could not move back and stay at the new place");
  }
  throw_refused(name(), what, error, total);
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
