// sdalloc/resources/host_resource.hpp - host memory straight from the operating system.
//
// HostResource maps every request with mmap (anonymous, private), so freed segments go back
// to the system at once and never fragment the C heap. Results are page-aligned (4 KiB),
// or 2 MiB-aligned when transparent huge pages are requested, in which case the range is
// also advised MADV_HUGEPAGE so the kernel backs it with 2 MiB pages (fewer page faults and
// TLB misses on multi-GiB activations). Pages are not touched here: the kernel supplies them
// on first write. Thread-safe; streams are ignored. A failed mmap throws OutOfMemory naming
// the request and errno's text.
// coalesce (core/resource.hpp) moves the returned ranges' pages into the new range with
// mremap, in their order, so pages already faulted in stay resident instead of being
// unmapped and faulted in again; what they do not cover is fresh (zero) memory.
//
// Growth room (options.growth_room, on by default): every range is mapped with as much
// address space again behind it, reserved (PROT_NONE, no memory, no commit charge), so that
// grow() can extend it in place: the new part is mapped over the room, its pages the donors'
// (moved) and fresh ones beyond. The only state the resource keeps is where each room lies;
// deallocate, coalesce and the destructor unmap a range's room with it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <string>

#include "sdalloc/core/resource.hpp"

namespace sdalloc {

struct HostResourceOptions {
  bool transparent_huge_pages = false;  // align to 2 MiB and madvise(MADV_HUGEPAGE)
  bool populate = false;                // MAP_POPULATE: fault all pages in at allocation
  bool growth_room = true;              // reserve address space behind each range: grow()
};

class HostResource final : public MemoryResource {
 public:
  HostResource() = default;
  explicit HostResource(HostResourceOptions options) : options_(options) {}
  ~HostResource() override;  // unmaps the rooms still reserved (ranges are the caller's)

  std::string name() const override;
  bool can_coalesce() const override { return true; }
  bool can_grow() const override { return options_.growth_room; }
  std::size_t page_size() const override {
    return options_.transparent_huge_pages ? kHugePageSize : kPageSize;
  }
  const HostResourceOptions& options() const { return options_; }

  static constexpr std::size_t kPageSize = 4096;
  static constexpr std::size_t kHugePageSize = std::size_t{2} << 20;

 private:
  void* do_allocate(std::size_t bytes, Stream stream) override;
  void do_deallocate(void* ptr, std::size_t bytes, Stream stream) override;
  void* do_coalesce(std::span<const ResourceRange> ranges, std::size_t bytes,
                    Stream stream) override;
  bool do_split(void* ptr, std::size_t bytes, std::size_t first) override;
  bool do_grow(void* ptr, std::size_t bytes, std::size_t new_bytes,
               std::span<const ResourceRange> donors, Stream stream) override;
  void* map(std::size_t bytes, bool populate);
  std::size_t move_in(std::span<const ResourceRange> ranges, std::uintptr_t start,
                      std::size_t length, bool& moved_all);
  // The room that starts at `end` (a range's end): unmapped and forgotten, if any.
  void drop_room(std::uintptr_t end);
  // Takes `bytes` from the front of the room that starts at `end`; false if it has fewer.
  bool claim_room(std::uintptr_t end, std::size_t bytes);

  HostResourceOptions options_;
  std::mutex rooms_mutex_;
  std::map<std::uintptr_t, std::size_t> rooms_;  // start -> bytes of each reserved room
};

// Faults every page of the host memory [base, base + length) in, writable, so later first
// writes cost no page fault: MADV_POPULATE_WRITE (Linux 5.14) and then a zero byte written
// into each 4 KiB page, which also makes a lazily backed virtual machine's host supply the
// page - so only for memory whose contents do not matter yet. Returns false, with errno
// set, when the kernel cannot supply the pages.
bool prefault_host_pages(void* base, std::size_t length);

// Moves the pages of the host mapping [from, from + length) to [to, to + length), replacing
// what is mapped there (mremap: page-table entries move, nothing is copied or faulted);
// `from` is left unmapped. Both must be page-aligned. A piece that cannot move is unmapped
// and `to` gets fresh zero pages there instead; false only when even that fails (errno
// set), with `to` then partly unmapped. HostResource's coalesce and the CPU drop-in's range
// use it.
bool move_host_pages(void* from, void* to, std::size_t length);

}  // namespace sdalloc
