// sdalloc/core/virtual_memory.hpp - address ranges and physical chunks, mapped separately.
//
// A VirtualMemory separates the two things a plain resource hands out together: an address
// range and the physical memory behind it. A pool reserves one large range of addresses
// (which costs no memory), creates physical chunks, and maps each chunk at an offset of the
// range where live allocations need memory. A chunk that is no longer needed at one place
// can be unmapped there and mapped at another, so free memory scattered over a range can
// be "stitched" into the contiguous space a new request needs, instead of reserving more.
// VirtualMemoryPool (virtual_memory_pool.hpp) is the pool built on this interface.
//
// Implementations:
//   HostVirtualMemory (host_virtual_memory.hpp)  Linux: mmap(PROT_NONE) reserves a range,
//                                                 mmap(MAP_FIXED) maps anonymous pages
//                                                 there, mremap moves them.
//   CudaVirtualMemory (with the CUDA backend)     cuMemAddressReserve / cuMemAddressFree,
//                                                 cuMemCreate / cuMemRelease, cuMemMap +
//                                                 cuMemSetAccess / cuMemUnmap.
//
// Units. granularity() is the unit of everything: reservation sizes and alignments, chunk
// sizes, and the addresses at which chunks are mapped are multiples of it (4 KiB on the
// host, the allocation granularity of the device with CUDA, typically 2 MiB). A caller may
// use larger chunks (any multiple); each chunk is mapped and unmapped as a whole, at one
// address at a time.
//
// Rules every caller keeps (implementations may check them, and must not rely on more):
//  - A chunk is mapped only inside a range this object reserved, at an offset that is a
//    multiple of granularity(), over addresses where nothing is mapped.
//  - unmap(address, bytes, stream) names exactly one mapping made by map(): the same
//    address and the chunk's full size. A chunk may be destroyed only while unmapped, and a
//    range released only once nothing is mapped in it.
//  - Work done before unmap: device work queued on a stream may still read or write a
//    mapping after the host has moved on. unmap is therefore given the stream that last used
//    the memory and must not remove the mapping before all work queued on that stream so far
//    has completed (CUDA: cuStreamSynchronize(stream) before cuMemUnmap; the host has no
//    queued work and ignores it). The caller must ensure no other stream still uses it (a
//    pool waits for cross-stream frees before the memory counts as free). Once unmap
//    returns, the chunk may be mapped elsewhere and used at once by any stream.
//  - Rollback: every call either does all it says or throws and changes nothing. In
//    particular map() either leaves the chunk mapped AND accessible (CUDA: cuMemMap, then
//    cuMemSetAccess for the device) or, if any step fails, undoes the steps already done
//    (cuMemUnmap) before it throws, so nothing is mapped at `address`. A caller that maps
//    several chunks for one request likewise unmaps the ones it mapped when a later one
//    fails (VirtualMemoryPool does).
//
// Contents: move() takes a chunk's contents along. What an unmapped chunk keeps is the
// implementation's: a CUDA allocation handle owns its memory and keeps it; the host frees
// the pages at unmap, and a chunk mapped again reads as zeros. A caller therefore unmaps
// only memory whose contents nobody needs (VirtualMemoryPool unmaps only pages that lie
// wholly in free space). New chunks may hold anything (the host gives zeros).
//
// Errors (sdalloc/core/errors.hpp):
//   reserve  OutOfMemory when no address range of that size can be reserved.
//   create   OutOfMemory when the physical memory is not available (CUDA_ERROR_OUT_OF_MEMORY,
//            the host's physical_limit), Error for other failures.
//   map      OutOfMemory when the system lacks the resources to map (page tables: ENOMEM,
//            CUDA_ERROR_OUT_OF_MEMORY), Error otherwise; nothing is mapped either way.
//   move     OutOfMemory when the system lacks the resources to map (Linux at its mapping
//            limit), Error otherwise; nothing has moved either way.
//   release, destroy, unmap  cannot fail when the rules are kept; a failure reported by the
//            system there (a broken device) is thrown as Error, and what was being freed is
//            then lost (leaked), never half-freed.
//   Any call with arguments that break the units or rules above throws InvalidArgument
//   where the implementation can tell (sizes not multiples of granularity(), zero sizes).
//
// Thread-safety: every member may be called from any number of threads at once, provided
// concurrent calls concern different chunks and non-overlapping addresses (a pool serialises
// the calls that touch one range by itself).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "sdalloc/core/stream.hpp"

namespace sdalloc {

// A piece of physical memory, identified by the implementation's handle.
struct PhysicalChunk {
  std::uint64_t handle = 0;  // CUmemGenericAllocationHandle, or the host's own numbering
  std::size_t bytes = 0;     // a multiple of granularity(); 0 means "no chunk"

  friend constexpr bool operator==(const PhysicalChunk&, const PhysicalChunk&) = default;
};

class VirtualMemory {
 public:
  VirtualMemory() = default;
  VirtualMemory(const VirtualMemory&) = delete;
  VirtualMemory& operator=(const VirtualMemory&) = delete;
  virtual ~VirtualMemory() = default;

  // The unit of sizes, alignments and mapping offsets (see "Units"). A power of two.
  virtual std::size_t granularity() const = 0;

  // --- address ranges -----------------------------------------------------------------
  // Reserves `bytes` (a positive multiple of granularity()) of address space, aligned to
  // `alignment` (0 or a power of two; 0 and anything below granularity() mean
  // granularity()). Nothing is mapped there yet: touching it faults. Costs no memory.
  virtual void* reserve(std::size_t bytes, std::size_t alignment = 0) = 0;
  // Gives a reserved range back. `base` and `bytes` are exactly what reserve() gave and was
  // asked for; nothing may be mapped in it any more.
  virtual void release(void* base, std::size_t bytes) = 0;

  // --- physical chunks ----------------------------------------------------------------
  // Creates a chunk of `bytes` (a positive multiple of granularity()) of physical memory.
  virtual PhysicalChunk create(std::size_t bytes) = 0;
  // Frees the chunk's memory; it must not be mapped anywhere.
  virtual void destroy(PhysicalChunk chunk) = 0;

  // --- mappings -----------------------------------------------------------------------
  // Maps the whole chunk at `address` (inside a reserved range, a multiple of granularity()
  // from its base, over unmapped addresses) with read and write access for the device that
  // owns it. All or nothing: see "Rollback".
  virtual void map(void* address, PhysicalChunk chunk) = 0;
  // Removes the mapping at `address` of `bytes` (a chunk's full size) once all work queued
  // on `last_use` so far has completed; the chunk keeps its contents and may be mapped
  // again. See "Work done before unmap".
  virtual void unmap(void* address, std::size_t bytes, Stream last_use) = 0;

  // --- mapping runs (optional) ---------------------------------------------------------
  // Whether map_run() works here: where it does, a caller maps a run of chunks in one call
  // instead of one map() each (the host: one mmap).
  virtual bool maps_runs() const { return false; }
  // Maps `count` chunks one after another from `address` (each at the end of the one
  // before), as map() would each: all or nothing, nothing mapped when it throws. Where
  // maps_runs() is false: InvalidArgument.
  virtual void map_run(void* address, const PhysicalChunk* chunks, std::size_t count);

  // --- moving mappings (optional) -----------------------------------------------------
  // Whether move() works here. A caller that cannot move unmaps and maps instead, which
  // has the same result: moving is only cheaper (the host moves the page tables with the
  // mappings, so nothing is torn down and built again, and one call moves a whole run).
  virtual bool can_move() const { return false; }
  // Moves `count` mappings made by map(), of `chunks` in that order, placed one after
  // another from `from` (each chunk at the end of the one before), to the same places from
  // `to` (inside a reserved range, over unmapped addresses that do not overlap the
  // mappings moved), once all work queued on `last_use` so far has completed, as unmap
  // would. Afterwards the addresses from `from` are reserved space again, and the chunks,
  // with their contents, are mapped and accessible from `to`. All or nothing: a failure
  // leaves every chunk where it was. Where can_move() is false: InvalidArgument. Chunks
  // whose handles follow each other (handle + bytes) may be cheaper to move together: the
  // host moves each such run in one system call.
  virtual void move(void* from, void* to, const PhysicalChunk* chunks, std::size_t count,
                    Stream last_use);

  // Most physical bytes this object can create, or 0 when it has no fixed limit.
  virtual std::size_t physical_capacity() const { return 0; }
  // Most physical bytes that can ever exist at once: physical_capacity() where there is a
  // fixed limit, else what the machine has (the host: RAM + swap); 0 when unknown. A pool
  // refuses at once a request that needs more, instead of creating chunks one by one until
  // the system says no (a 1 TiB request is 16 M chunks of 64 KiB).
  virtual std::size_t physical_ceiling() const { return physical_capacity(); }
  // Short name for tables and error messages, e.g. "host-vm(anonymous)", "cuda-vm(device 0)".
  virtual std::string name() const = 0;
};

}  // namespace sdalloc
