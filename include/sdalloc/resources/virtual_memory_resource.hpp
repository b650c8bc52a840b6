// sdalloc/resources/virtual_memory_resource.hpp - ranges that grow in place, over any
// VirtualMemory (a GPU's through the CUDA driver, or the host's memfd).
//
// A CachingPool over cudaMalloc cannot grow its consolidated arena or reuse a released
// segment's memory for the next one: cudaMalloc's ranges are fixed. Replayed as on a GPU
// (`sdalloc replay --device-like`), a change of shape then costs the arena plus a segment
// beside it: 1.554 x live on seq_ascending, 1.330 x on the SD pipeline, against 1.051 and
// 1.251 over host memory, where ranges grow. VirtualMemoryResource hands out ranges made of
// physical chunks mapped at the front of a reservation twice their size, so that
//  - grow() maps more memory behind a range (the donors' chunks first, then fresh ones),
//    while its room lasts (beyond it grow answers false and the pool takes a new range);
//  - coalesce() maps the returned ranges' chunks into the new range instead of freeing
//    them and creating new ones: on a GPU, no cudaFree/cudaMalloc pair and no device
//    synchronisation beyond the returned ranges' streams.
//     CudaVirtualMemory device_memory(0);
//     VirtualMemoryResource ranges(device_memory);
//     CachingPool pool(ranges);   // grows its arena on the device as on the host
// Sizes are rounded up to the VirtualMemory's granularity (2 MiB on CUDA, 4 KiB on the
// host), which page_size() reports so that a pool rounds its huge segments to it.
//
// Memory comes in chunks of at most kChunkBytes (2 MiB, or the granularity where that is
// larger), created one after another, so that a range can be split wherever chunks meet:
// split() cuts a range on a chunk boundary into two that are returned on their own (a
// CachingPool keeps the part of a released segment that a new one does not need, its spare
// pages) and refuses any other cut. The first part may then grow only up to the second.
// A donor chunk that does not fit the space left is destroyed, not cut; destroyed chunks go
// before new ones are created, so the physical memory in use never exceeds the old ranges'
// or the new range's. Each returned range is unmapped on the stream of the call (unmap
// waits for the work queued on it, as VirtualMemory::unmap says). A reservation is released
// once every range cut from it is returned.
//
// Errors: a range this resource did not hand out (deallocate, coalesce, grow) is
// InvalidPointer, before anything changes. OutOfMemory from the VirtualMemory (address space,
// physical memory; at once for more than the memory can ever hold, physical_ceiling())
// leaves nothing behind: allocate and coalesce reserve and map nothing, a
// failed grow leaves the range its size (the donors returned all the same, as
// MemoryResource::grow says). Thread-safe: one mutex guards the table of ranges; the
// VirtualMemory's calls are made outside it. The VirtualMemory must outlive the resource;
// the destructor frees the ranges still handed out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "sdalloc/core/resource.hpp"
#include "sdalloc/core/virtual_memory.hpp"

namespace sdalloc {

class VirtualMemoryResource final : public MemoryResource {
 public:
  explicit VirtualMemoryResource(VirtualMemory& memory) : memory_(memory) {}
  ~VirtualMemoryResource() override;

  std::string name() const override { return "vm-ranges(" + memory_.name() + ")"; }
  bool can_coalesce() const override { return true; }
  bool can_grow() const override { return true; }
  std::size_t page_size() const override { return memory_.granularity(); }
  std::size_t capacity() const override { return memory_.physical_capacity(); }

  static constexpr std::size_t kChunkBytes = std::size_t{2} << 20;

  // Ranges handed out and not yet returned, and the physical bytes mapped in them.
  std::size_t ranges() const;
  std::size_t mapped_bytes() const;

 private:
  struct Range {
    std::uintptr_t reservation = 0;     // the start of the reservation it lies in
    std::uintptr_t limit = 0;           // how far it may grow: the next range or the end
    std::size_t mapped = 0;             // bytes of chunks mapped from the range's start
    std::vector<PhysicalChunk> chunks;  // in address order
  };
  struct Reservation {
    std::size_t bytes = 0;
    std::size_t ranges = 0;  // ranges in it not yet returned
  };

  void* do_allocate(std::size_t bytes, Stream stream) override;
  void do_deallocate(void* ptr, std::size_t bytes, Stream stream) override;
  void* do_coalesce(std::span<const ResourceRange> ranges, std::size_t bytes,
                    Stream stream) override;
  bool do_grow(void* ptr, std::size_t bytes, std::size_t new_bytes,
               std::span<const ResourceRange> donors, Stream stream) override;
  bool do_split(void* ptr, std::size_t bytes, std::size_t first) override;

  std::size_t rounded(std::size_t bytes, const char* call) const;
  // Takes the ranges out of the table (all or none: InvalidPointer for one not there).
  std::vector<Range> take(std::span<const ResourceRange> ranges, const char* call);
  // Takes `ranges` out of the table and unmaps them: their chunks, answered, are the
  // caller's. Should an unmap fail, the chunks unmapped so far are destroyed: the ranges are
  // returned whatever happens (resource.hpp).
  std::vector<PhysicalChunk> return_ranges(std::span<const ResourceRange> ranges, Stream stream,
                                           const char* call);
  // Unmaps a taken range's chunks (they become `spare`) and releases its reservation when
  // no other range lies in it.
  void unmap_into(void* base, Range& range, Stream stream, std::vector<PhysicalChunk>& spare);
  // Maps chunks at `base` + [from, to): spare ones that fit first, then fresh ones of at
  // most the chunk size for the rest; destroys the spare chunks left. On failure unmaps what it
  // mapped, destroys every chunk it was given or made, and rethrows. Returns the chunks mapped, in
  // order.
  std::vector<PhysicalChunk> fill(char* base, std::size_t from, std::size_t to,
                                  std::vector<PhysicalChunk> spare, Stream stream);
  void destroy_all(const std::vector<PhysicalChunk>& chunks) noexcept;
  std::size_t chunk_bytes() const;

  VirtualMemory& memory_;
  mutable std::mutex mutex_;
  std::map<std::uintptr_t, Range> ranges_;              // by start address
  std::map<std::uintptr_t, Reservation> reservations_;  // by start address
};

}  // namespace sdalloc
