// heap_resources.hpp - resources over the heap for the fuzzers: no system call per operation.
//
// A fuzzer builds and destroys a pool per input, thousands of times a second; mmap'd host
// memory would make every segment two system calls and every chunk four. These stand-ins
// hand out heap memory (so AddressSanitizer sees every byte a pool touches outside what it
// was given) and check their callers' side of the contract as they go:
//  - HeapResource: a MemoryResource with a capacity; deallocate must name a live segment
//    with its size. Segments a pool never gave back are freed when it is destroyed.
//  - HeapVirtualMemory: a VirtualMemory whose reservations are heap ranges and whose map
//    and unmap only keep books: map must target an unmapped, granule-aligned place inside a
//    reservation with a chunk that exists and is not mapped elsewhere; unmap must name
//    mapped pages; destroy an unmapped chunk; move (where made with `moves`) must name
//    chunks mapped one after another at its source and an unmapped place inside a
//    reservation. is_mapped() lets a harness check that every live allocation lies on
//    mapped pages. physical_limit caps the bytes of chunks.
// A broken rule throws std::logic_error: not an sdalloc::Error, so the harness reports it.
//
// Both take their memory from a RegionCache, which keeps what one input gave back for the
// next: the sanitizer's allocator maps every region this large afresh and unmaps it on free,
// and the first touch of each page then faulted: 21 % of the pools fuzzer's samples (perf),
// 7 % with the cache; its system time halved (1.0 -> 0.55 s replaying 3,616 inputs).
// AddressSanitizer still sees every stray byte: a cached region is poisoned, a segment is
// unpoisoned exactly while it is handed out, and a reservation's pages only while they are
// mapped (an access to reserved, unmapped memory, which would fault on a device, is a
// finding here too).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <sanitizer/asan_interface.h>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/core/resource.hpp"
#include "sdalloc/core/virtual_memory.hpp"

namespace sdalloc::fuzz {

inline std::size_t round_to_page(std::size_t bytes) { return (bytes + 4095) / 4096 * 4096; }

// ===================================================================== RegionCache

// Aligned heap regions kept by (size, alignment) across inputs, poisoned while cached. Holds
// at most kLimit bytes; beyond that a given-back region is freed. One per process, never
// destroyed (reachable, so not a leak); the fuzzers run one input at a time.
class RegionCache {
 public:
  static constexpr std::size_t kLimit = std::size_t{256} << 20;

  static RegionCache& instance() {
    static auto* cache = new RegionCache;
    return *cache;
  }

  // A region of `bytes` (a multiple of 4096), poisoned; nullptr when the heap has none.
  void* take(std::size_t bytes, std::size_t alignment) {
    auto& spare = spare_[{bytes, alignment}];
    if (spare.empty()) {
      void* fresh = std::aligned_alloc(alignment, bytes);
      if (fresh != nullptr) ASAN_POISON_MEMORY_REGION(fresh, bytes);
      return fresh;
    }
    void* p = spare.back();
    spare.pop_back();
    cached_ -= bytes;
    return p;
  }

  void give_back(void* p, std::size_t bytes, std::size_t alignment) {
    if (cached_ + bytes > kLimit) {
      ASAN_UNPOISON_MEMORY_REGION(p, bytes);
      std::free(p);
      return;
    }
    ASAN_POISON_MEMORY_REGION(p, bytes);
    spare_[{bytes, alignment}].push_back(p);
    cached_ += bytes;
  }

 private:
  std::map<std::pair<std::size_t, std::size_t>, std::vector<void*>> spare_;
  std::size_t cached_ = 0;
};

// ===================================================================== HeapResource

class HeapResource final : public MemoryResource {
 public:
  explicit HeapResource(std::size_t capacity) : capacity_(capacity) {}
  ~HeapResource() override {
    for (const auto& [ptr, bytes] : live_)
      RegionCache::instance().give_back(ptr, round_to_page(bytes), 4096);
  }
  std::size_t capacity() const override { return capacity_; }
  std::string name() const override { return "heap"; }
  std::size_t used() const { return used_; }

 private:
  void* do_allocate(std::size_t bytes, Stream) override {
    if (bytes == 0 || bytes > capacity_ - used_) {
      throw OutOfMemory("heap: capacity reached", {.requested = bytes, .capacity = capacity_});
    }
    void* p = RegionCache::instance().take(round_to_page(bytes), 4096);
    if (p == nullptr) throw OutOfMemory("heap: aligned_alloc failed", {.requested = bytes});
    ASAN_UNPOISON_MEMORY_REGION(p, bytes);
    live_.emplace(p, bytes);
    used_ += bytes;
    return p;
  }
  void do_deallocate(void* ptr, std::size_t bytes, Stream) override {
    const auto it = live_.find(ptr);
    if (it == live_.end() || it->second != bytes) {
      throw std::logic_error("heap: deallocate of a segment not handed out, or a wrong size");
    }
    used_ -= bytes;
    live_.erase(it);
    RegionCache::instance().give_back(ptr, round_to_page(bytes), 4096);
  }

  std::size_t capacity_;
  std::size_t used_ = 0;
  std::unordered_map<void*, std::size_t> live_;
};

// ===================================================================== HeapVirtualMemory

class HeapVirtualMemory final : public VirtualMemory {
 public:
  static constexpr std::size_t kGranularity = 4096;

  explicit HeapVirtualMemory(std::size_t physical_limit, bool moves = false)
      : limit_(physical_limit), moves_(moves) {}
  ~HeapVirtualMemory() override {
    for (const auto& [base, r] : reserved_) {
      RegionCache::instance().give_back(reinterpret_cast<void*>(base), r.bytes, r.alignment);
    }
  }

  std::size_t granularity() const override { return kGranularity; }
  std::size_t physical_capacity() const override { return limit_; }
  std::string name() const override { return "heap-vm"; }

  void* reserve(std::size_t bytes, std::size_t alignment) override {
    if (bytes == 0 || bytes % kGranularity != 0 || bytes > (std::size_t{1} << 26)) {
      throw OutOfMemory("heap-vm: reserve refused", {.requested = bytes});
    }
    const std::size_t align = alignment > kGranularity ? alignment : kGranularity;
    if (align > (std::size_t{1} << 26)) throw OutOfMemory("heap-vm: alignment", {});
    void* p = RegionCache::instance().take(bytes, align);  // poisoned: nothing mapped yet
    if (p == nullptr) throw OutOfMemory("heap-vm: aligned_alloc failed", {.requested = bytes});
    reserved_.emplace(reinterpret_cast<std::uintptr_t>(p), Reservation{bytes, align});
    return p;
  }
  void release(void* base, std::size_t bytes) override {
    const auto it = reserved_.find(reinterpret_cast<std::uintptr_t>(base));
    if (it == reserved_.end() || it->second.bytes != bytes) broken("release of no reservation");
    const auto m = mapped_.lower_bound(it->first);
    if (m != mapped_.end() && m->first < it->first + bytes) broken("release of mapped pages");
    RegionCache::instance().give_back(base, bytes, it->second.alignment);
    reserved_.erase(it);
  }
  PhysicalChunk create(std::size_t bytes) override {
    if (bytes == 0 || bytes % kGranularity != 0) broken("create of a size not granular");
    if (limit_ != 0 && bytes > limit_ - physical_) {
      throw OutOfMemory("heap-vm: physical limit", {.requested = bytes, .capacity = limit_});
    }
    const PhysicalChunk chunk{++last_handle_, bytes};
    chunks_.emplace(chunk.handle, Chunk{bytes, false});
    physical_ += bytes;
    return chunk;
  }
  void destroy(PhysicalChunk chunk) override {
    const auto it = chunks_.find(chunk.handle);
    if (it == chunks_.end() || it->second.bytes != chunk.bytes) broken("destroy of no chunk");
    if (it->second.mapped) broken("destroy of a mapped chunk");
    physical_ -= chunk.bytes;
    chunks_.erase(it);
  }
  void map(void* address, PhysicalChunk chunk) override {
    const auto a = reinterpret_cast<std::uintptr_t>(address);
    const auto c = chunks_.find(chunk.handle);
    if (c == chunks_.end() || c->second.bytes != chunk.bytes) broken("map of no chunk");
    if (c->second.mapped) broken("map of a chunk mapped already");
    if (a % kGranularity != 0 || !inside_reservation(a, chunk.bytes)) broken("map outside");
    auto next = mapped_.lower_bound(a);
    if (next != mapped_.end() && next->first < a + chunk.bytes) broken("map over mapped pages");
    if (next != mapped_.begin()) {
      const auto prev = std::prev(next);
      if (prev->first + prev->second.bytes > a) broken("map over mapped pages");
    }
    mapped_.emplace(a, Mapping{chunk.bytes, chunk.handle});
    c->second.mapped = true;
    ASAN_UNPOISON_MEMORY_REGION(address, chunk.bytes);
  }
  void unmap(void* address, std::size_t bytes, Stream) override {
    const auto m = mapped_.find(reinterpret_cast<std::uintptr_t>(address));
    if (m == mapped_.end() || m->second.bytes != bytes) broken("unmap of no one mapping");
    chunks_.at(m->second.handle).mapped = false;
    mapped_.erase(m);
    ASAN_POISON_MEMORY_REGION(address, bytes);
  }
  bool can_move() const override { return moves_; }
  // Books only, like map: the bytes at the new place are whatever the heap holds there (a
  // pool moves only free pages, whose contents nobody reads).
  void move(void* from, void* to, const PhysicalChunk* chunks, std::size_t count, Stream) override {
    if (!moves_) broken("move where can_move() is false");
    const auto src = reinterpret_cast<std::uintptr_t>(from);
    const auto dst = reinterpret_cast<std::uintptr_t>(to);
    std::size_t total = 0;
    for (std::size_t i = 0; i < count; ++i) {
      const auto m = mapped_.find(src + total);
      if (m == mapped_.end() || m->second.handle != chunks[i].handle ||
          m->second.bytes != chunks[i].bytes) {
        broken("move of chunks not mapped one after another there");
      }
      total += chunks[i].bytes;
    }
    if (dst % kGranularity != 0 || !inside_reservation(dst, total)) broken("move outside");
    auto next = mapped_.lower_bound(dst);
    if (next != mapped_.end() && next->first < dst + total) broken("move over mapped pages");
    if (next != mapped_.begin() && std::prev(next)->first + std::prev(next)->second.bytes > dst) {
      broken("move over mapped pages");
    }
    for (std::size_t offset = 0; offset < total;) {
      auto node = mapped_.extract(src + offset);
      const std::size_t bytes = node.mapped().bytes;
      node.key() = dst + offset;
      mapped_.insert(std::move(node));
      offset += bytes;
    }
    ASAN_POISON_MEMORY_REGION(from, total);
    ASAN_UNPOISON_MEMORY_REGION(to, total);
  }

  // Whether every byte of [p, p + bytes) lies on mapped pages.
  bool is_mapped(const void* p, std::size_t bytes) const {
    auto at = reinterpret_cast<std::uintptr_t>(p);
    const std::uintptr_t end = at + bytes;
    while (at < end) {
      auto m = mapped_.upper_bound(at);
      if (m == mapped_.begin()) return false;
      --m;
      if (m->first + m->second.bytes <= at) return false;
      at = m->first + m->second.bytes;
    }
    return true;
  }
  std::size_t physical_bytes() const { return physical_; }

 private:
  struct Chunk {
    std::size_t bytes;
    bool mapped;
  };
  struct Mapping {
    std::size_t bytes;
    std::uint64_t handle;
  };
  struct Reservation {
    std::size_t bytes;
    std::size_t alignment;
  };
  [[noreturn]] static void broken(const char* what) {
    throw std::logic_error(std::string("heap-vm: ") + what);
  }
  bool inside_reservation(std::uintptr_t a, std::size_t bytes) const {
    auto r = reserved_.upper_bound(a);
    if (r == reserved_.begin()) return false;
    --r;
    return a + bytes <= r->first + r->second.bytes;
  }

  std::size_t limit_;
  bool moves_;
  std::size_t physical_ = 0;
  std::uint64_t last_handle_ = 0;
  std::map<std::uintptr_t, Reservation> reserved_;
  std::map<std::uintptr_t, Mapping> mapped_;
  std::unordered_map<std::uint64_t, Chunk> chunks_;
};

}  // namespace sdalloc::fuzz
