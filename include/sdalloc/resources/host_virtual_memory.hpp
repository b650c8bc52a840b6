// sdalloc/resources/host_virtual_memory.hpp - VirtualMemory on Linux host memory (anonymous pages).
//
// HostVirtualMemory implements the VirtualMemory interface (virtual_memory.hpp) with plain
// Linux calls, so a VirtualMemoryPool can be built, tested and measured on any machine:
//  - reserve: mmap(PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE): address space
//    only, no memory, no commit charge. Alignments above 4 KiB over-reserve and trim.
//  - create: a chunk is a budget of physical bytes (counted against physical_limit) and a
//    handle; it holds no memory until it is mapped and written.
//  - map: mmap(MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS) over the reserved addresses: fresh
//    zero pages, faulted in where they are first written. Anonymous pages fault in faster
//    than a shared file's (the kernel's shmem path: about 30 % per page here, measured in
//    docs/pools.md), and a fork()ed child gets them copy-on-write, as it gets the heap,
//    instead of sharing them with its parent. map_run maps a run of chunks side by side
//    with one mmap (maps_runs() is true): a block of many pages costs one system call.
//  - unmap: mmap(PROT_NONE, MAP_FIXED) over the mapping, which turns it back into reserved
//    space atomically (munmap would open a hole another thread's mmap could land in) and
//    frees its pages: a chunk mapped again reads as zeros (the contract allows it; a
//    VirtualMemoryPool unmaps only pages no allocation uses).
//  - move: mremap(MREMAP_FIXED | MREMAP_DONTUNMAP) takes the pages and their page tables
//    along, then mmap(PROT_NONE, MAP_FIXED) over the old place (DONTUNMAP leaves it mapped,
//    without pages, so it is never a hole). Chunks whose handles follow each other move in
//    one call where they are one kernel mapping, else one call each. A move of a run costs
//    far less per page than an unmap and a map (measured in
//    docs/notebook/virtual_memory_pool.md). Needs Linux 5.7 (DONTUNMAP): can_move() is false
//    before, found by trying it once at construction. A run the system refuses undoes the
//    runs moved before it; should moving one of those back be refused too (no memory left
//    for any kernel mapping), the Error says so and the tables show where each chunk is.
//
// Kernel mappings: Linux allows a process vm.max_map_count (65,530 by default) mappings,
// and every map() that the kernel cannot merge with a neighbour costs one. Fresh anonymous
// pages mapped right after a mapping of fresh pages merge with it, so a caller that maps
// new chunks at increasing addresses (a VirtualMemoryPool does) keeps gigabytes in a
// handful of mappings; pages that moved keep a mapping of their own until they move back
// beside the pages they were first mapped with. An unmap in the middle
// of a merged mapping splits it (up to two more); at the limit map() fails with
// OutOfMemory and unmap() with Error, the mapping staying in place.
//
// The object keeps a table of its ranges, mappings and chunks and checks every call
// against the rules of virtual_memory.hpp: a map outside a reserved range or over a
// mapping, an unmap that does not match a mapping, destroying a mapped chunk or releasing a
// range with mappings in it throw InvalidArgument before any system call, so a bug in a
// pool cannot clobber unrelated memory with MAP_FIXED. The CUDA driver rejects the same
// misuse. A destructor releases what the caller left behind.
//
// Granularity: the page size (4 KiB). Streams are ignored: the host queues no work.
// Thread-safe: one mutex guards the tables; system calls are made outside it.
// Errors: as virtual_memory.hpp says; the message names the call, the sizes and errno.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "sdalloc/core/virtual_memory.hpp"

namespace sdalloc {

struct HostVirtualMemoryOptions {
  // Most bytes of chunks that may exist at once (create throws OutOfMemory beyond); 0: no
  // limit but the machine's (physical_ceiling(): RAM + swap). Simulates a device of that
  // size.
  std::size_t physical_limit = 0;
  // Pre-fault the pages of a chunk when it is mapped (MAP_POPULATE). Costs one system call's
  // worth of work per chunk instead of one fault per 4 KiB page on first touch, but also
  // allocates pages the caller never touches. See docs/notebook/virtual_memory_pool.md for costs.
  bool populate = false;
  // move() with mremap where Linux can (5.13 on); false: can_move() is false, and callers
  // unmap and map instead (what a comparison of the two measures).
  bool move_mappings = true;
};

class HostVirtualMemory final : public VirtualMemory {
 public:
  static constexpr std::size_t kPageSize = 4096;

  // Throws InvalidArgument when physical_limit is not a multiple of the page size.
  explicit HostVirtualMemory(HostVirtualMemoryOptions options = {});
  ~HostVirtualMemory() override;

  std::size_t granularity() const override { return kPageSize; }
  void* reserve(std::size_t bytes, std::size_t alignment = 0) override;
  void release(void* base, std::size_t bytes) override;
  PhysicalChunk create(std::size_t bytes) override;
  void destroy(PhysicalChunk chunk) override;
  void map(void* address, PhysicalChunk chunk) override;
  // One mmap for the whole run (anonymous pages carry nothing of the chunk they stand for).
  bool maps_runs() const override { return true; }
  void map_run(void* address, const PhysicalChunk* chunks, std::size_t count) override;
  void unmap(void* address, std::size_t bytes, Stream last_use) override;
  bool can_move() const override { return moves_; }
  void move(void* from, void* to, const PhysicalChunk* chunks, std::size_t count,
            Stream last_use) override;
  std::size_t physical_capacity() const override { return options_.physical_limit; }
  // physical_limit, or without one RAM + swap (read at construction).
  std::size_t physical_ceiling() const override {
    return options_.physical_limit != 0 ? options_.physical_limit : machine_bytes_;
  }
  std::string name() const override;

  // Figures of what exists now: bytes of chunks created and not destroyed, bytes mapped,
  // bytes of address space reserved.
  std::size_t physical_bytes() const;
  std::size_t mapped_bytes() const;
  std::size_t reserved_bytes() const;
  const HostVirtualMemoryOptions& options() const { return options_; }

 private:
  struct Tables;

  HostVirtualMemoryOptions options_;
  std::size_t machine_bytes_ = 0;  // RAM + swap; 0 when sysinfo() failed
  bool moves_ = false;             // mremap(MREMAP_DONTUNMAP) of private anonymous pages works here
  mutable std::mutex mutex_;
  std::unique_ptr<Tables> tables_;
};

}  // namespace sdalloc
