// address_range.hpp - the one reserved range every byte the drop-in's pool hands out lies in.
//
// free() must tell sdalloc's pointers from glibc's in a few instructions, since most frees
// are glibc's. So at start the drop-in reserves one large range of address space
// (mmap PROT_NONE, MAP_NORESERVE: no memory, no commit charge) and its pool takes every
// segment (mode:pool, mode:planned: RangeResource) or virtual range (mode:vmm:
// RangeVirtualMemory) out of it. "Ours" is then `ptr - base < size`: one subtraction and one
// comparison, no lock, no table.
//
// Inside the range, pieces are carved first fit by address (the lowest free place: the range
// stays compact) from a free list of extents; giving a piece back re-protects it
// (mmap PROT_NONE, MAP_FIXED over it: the pages are freed, and no other mmap can land there)
// and merges it with its free neighbours. Pieces are mapped MAP_PRIVATE | MAP_ANONYMOUS:
// fresh pages are zero (calloc need not write them, see FreshPages) and a fork()ed child
// gets them copy-on-write, as it does glibc's heap.
//
// Thread-safety: contains() is lock-free (the bounds are set once, before the pool exists);
// carve/uncarve take one mutex; the bookkeeping allocates with malloc, which the drop-in sends
// to glibc while it is inside sdalloc.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "sdalloc/core/resource.hpp"
#include "sdalloc/core/virtual_memory.hpp"

namespace sdalloc::preload {

class ReservedRange {
 public:
  // Reserves `bytes` of address space, halving down to 1 GiB when the system refuses (an
  // address-space ulimit); false (errno set) when even that fails.
  bool reserve(std::size_t bytes);

  bool contains(const void* ptr) const {
    const auto offset =
        reinterpret_cast<std::uintptr_t>(ptr) - base_.load(std::memory_order_relaxed);
    return offset < size_.load(std::memory_order_relaxed);
  }
  // Whether all of [p, p + bytes) lies inside (bytes > 0).
  bool contains(std::uintptr_t p, std::size_t bytes) const {
    const std::uintptr_t offset = p - base();
    return offset < size() && bytes <= size() - offset;
  }
  std::uintptr_t base() const { return base_.load(std::memory_order_relaxed); }
  std::size_t size() const { return size_.load(std::memory_order_relaxed); }

  // A piece of `bytes` (a multiple of 4 KiB) aligned to `alignment` (a power of two >= 4 KiB),
  // still PROT_NONE; nullptr when no free extent is big enough.
  void* carve(std::size_t bytes, std::size_t alignment);
  // Gives a carved piece back (it must be PROT_NONE again: see protect()).
  void uncarve(void* piece, std::size_t bytes);
  std::size_t carved_bytes() const;

  // mmap(PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS) over [p, p + bytes):
  // fresh zero pages. false (errno set) when the kernel refuses. With huge pages on (the
  // `huge_pages` key), pieces of 2 MiB or more are madvise(MADV_HUGEPAGE)d as well.
  static bool commit(void* piece, std::size_t bytes);
  // Set once, before the pool serves anything (Runtime::build).
  static void use_huge_pages(bool on);
  // Back to reserved address space: the pages are freed.
  static void protect(void* piece, std::size_t bytes);

 private:
  std::atomic<std::uintptr_t> base_{0};
  std::atomic<std::size_t> size_{0};
  mutable std::mutex mutex_;
  std::map<std::uintptr_t, std::size_t> free_;  // extent start -> length
  std::size_t carved_ = 0;
};

// The bytes of fresh (never written, hence zero) pages the calling thread's current request
// mapped. The drop-in clears it before it asks the pool and calloc reads it after, so it
// writes zeros only over what was reused.
struct FreshPages {
  std::uintptr_t begin = 0;
  std::uintptr_t end = 0;

  static FreshPages& of_this_thread();
  void clear() { begin = end = 0; }
  // Notes [p, p + bytes) as fresh; a piece not adjacent to the current run replaces it when
  // it is larger (one run is enough for one request).
  void note(const void* piece, std::size_t bytes);
};

// mode:pool and mode:planned: segments carved from the range, committed on allocation (fresh
// pages, noted as FreshPages) and protected again on deallocation. capacity (0: none) caps
// the bytes held at once.
class RangeResource final : public MemoryResource {
 public:
  RangeResource(ReservedRange& range, std::size_t capacity);

  std::size_t capacity() const override { return capacity_; }
  std::string name() const override;
  std::size_t held() const { return held_.load(std::memory_order_relaxed); }

 private:
  void* do_allocate(std::size_t bytes, Stream stream) override;
  void do_deallocate(void* ptr, std::size_t bytes, Stream stream) override;
  // Gives back a piece of `length` bytes carved for `requested` that could not be mapped
  // (counted in held) and throws OutOfMemory with mmap's `error`.
  [[noreturn]] void refuse_piece(void* piece, std::size_t length, std::size_t requested, int error);
  // Carves and counts a piece of `length` bytes, still PROT_NONE; throws OutOfMemory
  // (nothing changed) past the capacity or when no place is left.
  void* carve_counted(std::size_t bytes, std::size_t length);

  ReservedRange& range_;
  const std::size_t capacity_;
  std::atomic<std::size_t> held_{0};
};

// mode:vmm: a VirtualMemory whose reserved ranges are carved from the one range. Its chunks
// are a budget (create/destroy count bytes against physical_limit) and map() commits fresh
// anonymous pages: a chunk does NOT keep its contents when it is unmapped and mapped
// elsewhere. VirtualMemoryPool never needs that (it moves only pages that lie wholly in free
// space), and anonymous private pages are what make fork() safe (HostVirtualMemory maps
// the same kind; it differs in taking its ranges from the system instead of this range).
// move() does keep them: mremap(MREMAP_DONTUNMAP) takes the pages and their page tables to
// the new place (Linux 5.7; probed once, at construction), so a page the pool moves is not
// freed and faulted in again as an unmap and a map would have it; the old place is made
// reserved space again at once (never a hole another mmap could land in). Moved pages are
// not FreshPages: they hold what was written there.
class RangeVirtualMemory final : public VirtualMemory {
 public:
  // Moves the pages of [from, from + bytes) to `to` with their page tables, leaving `from`
  // mapped but empty; answers 0 or the errno of the refusal (nothing moved then).
  using PageMover = int (*)(std::uintptr_t from, std::uintptr_t to, std::size_t bytes);
  // The kernel's: mremap(MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP).
  static int move_private_pages(std::uintptr_t from, std::uintptr_t to, std::size_t bytes);

  // `moves`: use move() where the kernel can (false: the pool unmaps and maps instead).
  // `mover` does each move (tests put in one that refuses, to reach the undo).
  RangeVirtualMemory(ReservedRange& range, std::size_t physical_limit, bool moves = true,
                     PageMover mover = &move_private_pages);

  std::size_t granularity() const override { return kPageSize; }
  void* reserve(std::size_t bytes, std::size_t alignment = 0) override;
  void release(void* base, std::size_t bytes) override;
  PhysicalChunk create(std::size_t bytes) override;
  void destroy(PhysicalChunk chunk) override;
  void map(void* address, PhysicalChunk chunk) override;
  // One commit for the whole run.
  bool maps_runs() const override { return true; }
  void map_run(void* address, const PhysicalChunk* chunks, std::size_t count) override;
  void unmap(void* address, std::size_t bytes, Stream last_use) override;
  bool can_move() const override { return moves_; }
  // All or nothing: one mremap for the whole run where it lies in one kernel mapping, else
  // one per chunk (a chunk is one map() and never spans two), each undone if a later one is
  // refused. InvalidArgument for what breaks the contract (outside the range, overlapping,
  // not whole pages) or where moves are off; OutOfMemory when the kernel lacks memory for
  // its mappings, Error otherwise.
  void move(void* from, void* to, const PhysicalChunk* chunks, std::size_t count,
            Stream last_use) override;
  std::size_t physical_capacity() const override { return physical_limit_; }
  std::string name() const override;

  static constexpr std::size_t kPageSize = 4096;

 private:
  ReservedRange& range_;
  const std::size_t physical_limit_;
  const PageMover mover_;
  const bool moves_;
  std::atomic<std::size_t> physical_{0};
  std::atomic<std::uint64_t> next_handle_{1};
};

}  // namespace sdalloc::preload
