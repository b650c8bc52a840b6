// address_range.cpp - the reserved range, its carving, and the two upstreams built on it.
#include "preload/address_range.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/bits.hpp"
#include "resources/page_table_move.hpp"
#include "sdalloc/core/errors.hpp"

namespace sdalloc::preload {

// =======================================================================================
// ReservedRange

namespace {
constexpr std::size_t kMinRange = std::size_t{1} << 30;
constexpr std::size_t kRangeAlignment = std::size_t{2} << 20;  // huge-page friendly pieces
}  // namespace

bool ReservedRange::reserve(std::size_t bytes) {
  for (std::size_t size = bytes; size >= kMinRange; size /= 2) {
    void* p = ::mmap(nullptr, size + kRangeAlignment, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) continue;
    const auto raw = reinterpret_cast<std::uintptr_t>(p);
    const std::uintptr_t base = round_up(raw, kRangeAlignment);
    // Trim the over-reservation so the range is exactly [base, base + size).
    if (base > raw) ::munmap(p, base - raw);
    const std::uintptr_t tail = raw + size + kRangeAlignment - (base + size);
    if (tail > 0) ::munmap(reinterpret_cast<void*>(base + size), tail);
    {
      std::lock_guard lock(mutex_);
      free_.emplace(base, size);
    }
    base_.store(base, std::memory_order_relaxed);
    size_.store(size, std::memory_order_relaxed);
    return true;
  }
  return false;
}

void* ReservedRange::carve(std::size_t bytes, std::size_t alignment) {
  std::lock_guard lock(mutex_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    const std::uintptr_t start = it->first;
    const std::size_t length = it->second;
    const std::uintptr_t aligned = round_up(start, alignment);
    if (aligned - start + bytes > length) continue;
    // Split [start, start+length) into head | piece | tail.
    const std::size_t head = aligned - start;
    const std::size_t tail = length - head - bytes;
    free_.erase(it);
    if (head > 0) free_.emplace(start, head);
    if (tail > 0) free_.emplace(aligned + bytes, tail);
    carved_ += bytes;
    return reinterpret_cast<void*>(aligned);
  }
  return nullptr;
}

void ReservedRange::uncarve(void* piece, std::size_t bytes) {
  std::lock_guard lock(mutex_);
  auto start = reinterpret_cast<std::uintptr_t>(piece);
  std::size_t length = bytes;
  auto next = free_.lower_bound(start);
  if (next != free_.end() && start + length == next->first) {
    length += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    const auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      length += prev->second;
      free_.erase(prev);
    }
  }
  free_.emplace(start, length);
  carved_ -= bytes;
}

std::size_t ReservedRange::carved_bytes() const {
  std::lock_guard lock(mutex_);
  return carved_;
}

namespace {
std::atomic<bool> g_huge_pages{false};
}  // namespace

void ReservedRange::use_huge_pages(bool on) { g_huge_pages.store(on, std::memory_order_relaxed); }

bool ReservedRange::commit(void* piece, std::size_t bytes) {
  if (::mmap(piece, bytes, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1,
             0) == MAP_FAILED) {
    return false;
  }
  // Only a speed-up (one fault and one TLB entry per 2 MiB instead of 512): where the kernel
  // refuses (THP off), the 4 KiB pages serve the same.
  if (bytes >= kRangeAlignment && g_huge_pages.load(std::memory_order_relaxed)) {
    (void)::madvise(piece, bytes, MADV_HUGEPAGE);
  }
  return true;
}

void ReservedRange::protect(void* piece, std::size_t bytes) {
  // Cannot fail for a range we hold (the kernel needs no new page-table memory to remove a
  // mapping); if it does, the pages stay mapped and the piece is still ours: only memory is
  // lost.
  (void)::mmap(piece, bytes, PROT_NONE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1,
               0);
}

// =======================================================================================
// FreshPages

FreshPages& FreshPages::of_this_thread() {
  static thread_local __attribute__((tls_model("initial-exec"))) FreshPages fresh;
  return fresh;
}

void FreshPages::note(const void* piece, std::size_t bytes) {
  const auto p = reinterpret_cast<std::uintptr_t>(piece);
  if (begin == end || (p != end && p + bytes != begin && bytes > end - begin)) {
    // None yet, or a run larger than the one kept and not adjacent to it: keep the new one.
    begin = p;
    end = p + bytes;
  } else if (p == end) {
    end += bytes;
  } else if (p + bytes == begin) {
    begin = p;
  }
}

// =======================================================================================
// RangeResource

namespace {
constexpr std::size_t kPage = 4096;

OutOfMemoryInfo info_of(std::size_t requested, std::size_t held, std::size_t capacity) {
  OutOfMemoryInfo info;
  info.requested = requested;
  info.reserved = held;
  info.capacity = capacity;
  return info;
}
}  // namespace

RangeResource::RangeResource(ReservedRange& range, std::size_t capacity)
    : range_(range), capacity_(capacity) {}

std::string RangeResource::name() const {
  return "preload-range(" + format_size(range_.size()) + ")";
}

void* RangeResource::carve_counted(std::size_t bytes, std::size_t length) {
  const std::size_t before = held_.fetch_add(length, std::memory_order_relaxed);
  if (capacity_ != 0 && before + length > capacity_) {
    held_.fetch_sub(length, std::memory_order_relaxed);
    throw OutOfMemory::describe("the drop-in's capacity", info_of(bytes, before, capacity_));
  }
  void* piece = range_.carve(length, length >= kRangeAlignment ? kRangeAlignment : kPage);
  if (piece == nullptr) {
    held_.fetch_sub(length, std::memory_order_relaxed);
    throw OutOfMemory::describe("the drop-in's address range", info_of(bytes, before, capacity_),
                                "no free place that large is left in the reserved address_space");
  }
  return piece;
}

// A failed MAP_FIXED may leave a hole: the piece is protected again before it goes back.
void RangeResource::refuse_piece(void* piece, std::size_t length, std::size_t requested,
                                 int error) {
  ReservedRange::protect(piece, length);
  range_.uncarve(piece, length);
  const std::size_t held = held_.fetch_sub(length, std::memory_order_relaxed) - length;
  throw OutOfMemory::describe("the drop-in's address range", info_of(requested, held, capacity_),
                              std::string("mmap: ") + std::strerror(error));
}

void* RangeResource::do_allocate(std::size_t bytes, Stream /*stream*/) {
  if (bytes == 0) return nullptr;
  const std::size_t length = round_up(bytes, kPage);
  void* piece = carve_counted(bytes, length);
  if (!ReservedRange::commit(piece, length)) refuse_piece(piece, length, bytes, errno);
  FreshPages::of_this_thread().note(piece, length);
  return piece;
}

void RangeResource::do_deallocate(void* ptr, std::size_t bytes, Stream /*stream*/) {
  if (ptr == nullptr) return;
  const std::size_t length = round_up(bytes, kPage);
  ReservedRange::protect(ptr, length);
  range_.uncarve(ptr, length);
  held_.fetch_sub(length, std::memory_order_relaxed);
}

// =======================================================================================
// RangeVirtualMemory

// `from` keeps an empty mapping (DONTUNMAP) until the caller protects it.
int RangeVirtualMemory::move_private_pages(std::uintptr_t from, std::uintptr_t to,
                                           std::size_t bytes) {
  return detail::move_with_page_tables(reinterpret_cast<void*>(from), reinterpret_cast<void*>(to),
                                       bytes);
}

RangeVirtualMemory::RangeVirtualMemory(ReservedRange& range, std::size_t physical_limit, bool moves,
                                       PageMover mover)
    : range_(range),
      physical_limit_(physical_limit),
      mover_(mover),
      moves_(moves && mover != nullptr && detail::can_move_private_pages()) {}

std::string RangeVirtualMemory::name() const {
  return "preload-vm(" + format_size(range_.size()) + ")";
}

void* RangeVirtualMemory::reserve(std::size_t bytes, std::size_t alignment) {
  if (bytes == 0 || bytes % kPageSize != 0) {
    throw InvalidArgument(
        "RangeVirtualMemory::reserve: bytes must be a positive multiple of 4 KiB");
  }
  void* piece = range_.carve(bytes, alignment < kPageSize ? kPageSize : alignment);
  if (piece == nullptr) {
    throw OutOfMemory::describe("the drop-in's address range", info_of(bytes, 0, 0),
                                "no free place that large is left in the reserved address_space");
  }
  return piece;
}

void RangeVirtualMemory::release(void* base, std::size_t bytes) { range_.uncarve(base, bytes); }

PhysicalChunk RangeVirtualMemory::create(std::size_t bytes) {
  if (bytes == 0 || bytes % kPageSize != 0) {
    throw InvalidArgument("RangeVirtualMemory::create: bytes must be a positive multiple of 4 KiB");
  }
  const std::size_t before = physical_.fetch_add(bytes, std::memory_order_relaxed);
  if (physical_limit_ != 0 && before + bytes > physical_limit_) {
    physical_.fetch_sub(bytes, std::memory_order_relaxed);
    throw OutOfMemory::describe("the drop-in's capacity", info_of(bytes, before, physical_limit_));
  }
  return {next_handle_.fetch_add(1, std::memory_order_relaxed), bytes};
}

void RangeVirtualMemory::destroy(PhysicalChunk chunk) {
  physical_.fetch_sub(chunk.bytes, std::memory_order_relaxed);
}

void RangeVirtualMemory::map(void* address, PhysicalChunk chunk) { map_run(address, &chunk, 1); }

void RangeVirtualMemory::map_run(void* address, const PhysicalChunk* chunks, std::size_t count) {
  if (count == 0) return;
  if (chunks == nullptr) throw InvalidArgument("RangeVirtualMemory::map_run: no chunks given");
  std::size_t total = 0;
  for (std::size_t i = 0; i < count; ++i) total += chunks[i].bytes;
  if (!range_.contains(reinterpret_cast<std::uintptr_t>(address), total)) {
    throw InvalidArgument("RangeVirtualMemory::map_run: the run is not inside the reserved range");
  }
  if (!ReservedRange::commit(address, total)) {
    const int error = errno;
    ReservedRange::protect(address, total);
    throw OutOfMemory::describe("the drop-in's address range", info_of(total, 0, 0),
                                std::string("mmap: ") + std::strerror(error));
  }
  FreshPages::of_this_thread().note(address, total);
}

void RangeVirtualMemory::unmap(void* address, std::size_t bytes, Stream /*last_use*/) {
  ReservedRange::protect(address, bytes);
}

void RangeVirtualMemory::move(void* from, void* to, const PhysicalChunk* chunks, std::size_t count,
                              Stream /*last_use*/) {
  if (!moves_) {
    throw InvalidArgument(
        "RangeVirtualMemory::move: moves are off here (the kernel cannot "
        "move private pages before Linux 5.7, or the drop-in turned them off)");
  }
  if (count == 0) return;
  if (chunks == nullptr) throw InvalidArgument("RangeVirtualMemory::move: no chunks given");
  std::size_t total = 0;
  for (std::size_t i = 0; i < count; ++i) {
    if (chunks[i].bytes == 0 || chunks[i].bytes % kPageSize != 0) {
      throw InvalidArgument(
          "RangeVirtualMemory::move: chunk sizes must be positive multiples "
          "of 4 KiB");
    }
    total += chunks[i].bytes;
  }
  const auto src = reinterpret_cast<std::uintptr_t>(from);
  const auto dst = reinterpret_cast<std::uintptr_t>(to);
  const auto inside = [&](std::uintptr_t p) {
    return p % kPageSize == 0 && range_.contains(p, total);
  };
  if (!inside(src) || !inside(dst)) {
    throw InvalidArgument(
        "RangeVirtualMemory::move: both places must be page-aligned and inside "
        "the reserved range");
  }
  if (src < dst + total && dst < src + total) {
    throw InvalidArgument("RangeVirtualMemory::move: the places overlap");
  }
  int error = mover_(src, dst, total);
  if (error != 0 && count > 1) {
    // Before Linux 6.17 a run over several kernel mappings (pages moved there earlier keep
    // mappings of their own) answers EFAULT: chunk by chunk then, each in one mapping. Any
    // other refusal is tried the same way, and reported by the chunk that meets it.
    std::size_t moved = 0;
    error = 0;
    for (std::size_t i = 0; i < count && error == 0; moved += chunks[i++].bytes) {
      error = mover_(src + moved, dst + moved, chunks[i].bytes);
      if (error != 0) {
        // Back where they were, in reverse. A chunk that will not go back either (the
        // kernel out of memory for mappings twice in a row) stays at `to` until the pool
        // maps there again (MAP_FIXED replaces it), and its old place, still mapped but
        // empty, reads as zero pages: the pool moves only free pages, whose contents
        // nobody reads, so the pool stays right about what is mapped where.
        for (std::size_t k = i; k-- > 0;) {
          moved -= chunks[k].bytes;
          if (mover_(dst + moved, src + moved, chunks[k].bytes) == 0) {
            ReservedRange::protect(reinterpret_cast<void*>(dst + moved), chunks[k].bytes);
          }
        }
        break;
      }
    }
  }
  if (error != 0) {
    const std::string what =
        std::string("RangeVirtualMemory::move: mremap: ") + std::strerror(error);
    if (error == ENOMEM)
      throw OutOfMemory::describe("the drop-in's address range", info_of(total, 0, 0), what);
    throw Error(what);
  }
  ReservedRange::protect(from, total);  // reserved space again, its pages gone with the move
}

}  // namespace sdalloc::preload
