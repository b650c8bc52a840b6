// sdalloc/core/resource.hpp - where memory comes from: the MemoryResource interface.
//
// A resource is two functions: allocate(bytes, stream) and deallocate(ptr, bytes, stream).
// Everything in sdalloc is built by nesting resources: allocators such as CachingPool take
// an upstream resource and are resources themselves; adaptors (LimitResource, StatsResource,
// TraceResource) wrap any resource and add one behaviour. A user composes the stack they
// need, e.g. StatsResource(LimitResource(HostResource, 8 GiB)) under a CachingPool.
//
// Contract every implementation keeps:
//  - Thread-safety: allocate and deallocate may be called from any number of threads at once.
//  - Alignment: a non-null result is aligned to at least kMinAlignment (256 bytes, the same
//    guarantee as cudaMalloc), enough for any tensor element type and vector load.
//  - Zero bytes: allocate(0, s) returns nullptr and reserves nothing; deallocate(nullptr, 0,
//    s) does nothing. This matches PyTorch and TensorRT.
//  - Streams: memory from allocate(bytes, s) may be used by work on s at once. The stream
//    given to deallocate is one on which the memory may be reused at once: the caller
//    promises that all work using it is ordered before that point of that stream.
//  - Failure: allocate throws OutOfMemory when the memory is not available and reserves
//    nothing. deallocate of a pointer this resource did not hand out is undefined for raw
//    resources (they cannot always tell); pools check and throw InvalidPointer.
//  - bytes passed to deallocate are the bytes passed to allocate.
//
// One optional operation sits beside the two: coalesce(ranges, bytes, stream) returns
// several ranges and hands out one, in one call. A pool that swaps its cached segments for one
// arena (CachingPool's consolidation, its release before growth) asks for it where the
// resource says it does better than the two functions (can_coalesce()): HostResource moves
// the returned ranges' pages into the new range (mremap), so the pages the pool's work has
// already faulted in are not faulted in again. Adaptors forward both; every other resource
// keeps the default, which is exactly deallocate for each range and then allocate.
//
// A second optional operation, split(ptr, bytes, first), makes one range the resource handed
// out two, each then returned on its own: CachingPool keeps the part of a released segment
// that a new segment does not need (its spare pages) instead of giving its pages back.
// HostResource and the drop-in's RangeResource allow it; adaptors forward it; the default
// refuses, and the caller keeps the range whole.
//
// A third, grow(ptr, bytes, new_bytes, donors), makes a range longer where it lies: CachingPool
// grows its consolidated arena when the work outgrows it (a larger shape, the VAE after the
// UNet) instead of taking a segment beside it, which would stay apart from it for good.
// HostResource maps every range with unused address space behind it for this, and moves the
// donors' pages into the new part as coalesce does; adaptors forward it; the default refuses.
//
// Beside them, four questions a pool may ask: can_coalesce(), can_grow(), capacity() and
// page_size().
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include "sdalloc/core/stream.hpp"

namespace sdalloc {

inline constexpr std::size_t kMinAlignment = 256;

// One range a resource handed out: what allocate returned and the bytes it was asked for.
struct ResourceRange {
  void* ptr = nullptr;
  std::size_t bytes = 0;
};

class MemoryResource {
 public:
  MemoryResource() = default;
  MemoryResource(const MemoryResource&) = delete;
  MemoryResource& operator=(const MemoryResource&) = delete;
  virtual ~MemoryResource() = default;

  void* allocate(std::size_t bytes, Stream stream = kDefaultStream) {
    return do_allocate(bytes, stream);
  }
  void deallocate(void* ptr, std::size_t bytes, Stream stream = kDefaultStream) {
    do_deallocate(ptr, bytes, stream);
  }

  // Returns every one of `ranges` (each from this resource, on `stream`, as deallocate
  // would) and then hands out a range of `bytes` (as allocate would; nullptr for 0 bytes).
  // The ranges are returned even when the new range is refused (OutOfMemory): the caller
  // gives them up either way. The contents of the new range are unspecified.
  void* coalesce(std::span<const ResourceRange> ranges, std::size_t bytes,
                 Stream stream = kDefaultStream) {
    return do_coalesce(ranges, bytes, stream);
  }
  // True when coalesce does better than the two functions it replaces (moves pages, saves
  // calls), and its returns cannot fail; callers use the two functions otherwise.
  virtual bool can_coalesce() const { return false; }
  // Makes the range [ptr, ptr + bytes) that this resource handed out two ranges, [ptr, ptr +
  // first) and [ptr + first, ptr + bytes), each returned (deallocate, coalesce) on its own
  // from then on. `first` is a multiple of 4 KiB, 0 < first < bytes. Answers false, and
  // nothing has changed, where the resource cannot (the default) or the cut is not one.
  bool split(void* ptr, std::size_t bytes, std::size_t first) {
    const bool a_cut = ptr != nullptr && first != 0 && first < bytes && first % 4096 == 0;
    return a_cut && do_split(ptr, bytes, first);
  }

  // Makes the range [ptr, ptr + bytes) that this resource handed out [ptr, ptr + new_bytes)
  // in place (new_bytes > bytes), returning every one of `donors` as coalesce does (where
  // the resource moves pages, theirs become the new part's). Answers false, and nothing has
  // changed (the donors are still the caller's), where it cannot: the default, or no room
  // behind the range. Throws OutOfMemory when the memory is not available; the range then
  // keeps its size and the donors have been returned all the same.
  bool grow(void* ptr, std::size_t bytes, std::size_t new_bytes,
            std::span<const ResourceRange> donors, Stream stream = kDefaultStream) {
    return ptr != nullptr && new_bytes > bytes && do_grow(ptr, bytes, new_bytes, donors, stream);
  }
  // True when grow may succeed (the pool then tries it before taking a new range).
  virtual bool can_grow() const { return false; }

  // The unit this resource maps its memory in, where nothing coarser is handed out (host
  // memory: its 4 KiB page, or 2 MiB with transparent huge pages), or 0 when unknown or
  // coarser than a caller should assume (CUDA rounds to 2 MiB inside the driver). A pool
  // that sizes a segment for one request rounds it to this instead of its own granularity:
  // CachingPool's huge segments (policies/caching_pool.hpp). Adaptors forward it.
  virtual std::size_t page_size() const { return 0; }
  // Most bytes this resource can ever hand out at once, or 0 when it has no fixed limit.
  // LimitResource reports its cap; a device resource its device memory.
  virtual std::size_t capacity() const { return 0; }
  // Short name for tables and error messages, e.g. "host", "limit(host, 8.0 GiB)".
  virtual std::string name() const = 0;

 private:
  virtual void* do_allocate(std::size_t bytes, Stream stream) = 0;
  virtual void do_deallocate(void* ptr, std::size_t bytes, Stream stream) = 0;
  // Default: deallocate each range, then allocate (a failed deallocate propagates, and the
  // ranges after it are not returned).
  virtual void* do_coalesce(std::span<const ResourceRange> ranges, std::size_t bytes,
                            Stream stream) {
    for (const ResourceRange& range : ranges) deallocate(range.ptr, range.bytes, stream);
    return allocate(bytes, stream);
  }
  // Called only with a cut split() checked: a page boundary inside a non-null range.
  virtual bool do_split(void* /*ptr*/, std::size_t /*bytes*/, std::size_t /*first*/) {
    return false;
  }
  // Called only with ptr non-null and new_bytes > bytes.
  virtual bool do_grow(void* /*ptr*/, std::size_t /*bytes*/, std::size_t /*new_bytes*/,
                       std::span<const ResourceRange> /*donors*/, Stream /*stream*/) {
    return false;
  }
};

}  // namespace sdalloc
