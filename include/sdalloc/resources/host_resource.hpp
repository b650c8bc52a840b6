// sdalloc/resources/host_resource.hpp - host memory straight from the operating system.
//
// HostResource maps every request with mmap (anonymous, private), so freed segments go back
// to the system at once and never fragment the C heap. Results are page-aligned (4 KiB),
// or 2 MiB-aligned when transparent huge pages are requested, in which case the range is
// also advised MADV_HUGEPAGE so the kernel backs it with 2 MiB pages (fewer page faults and
// TLB misses on multi-GiB activations). Pages are not touched here unless `populate` asks
// for it: the kernel supplies them on first write. Thread-safe, stateless; streams are
// ignored. A failed mmap throws OutOfMemory naming the request and errno's text.
#pragma once

#include <cstddef>
#include <string>

#include "sdalloc/core/resource.hpp"

namespace sdalloc {

struct HostResourceOptions {
  bool transparent_huge_pages = false;  // align to 2 MiB and madvise(MADV_HUGEPAGE)
  bool populate = false;                // MAP_POPULATE: fault all pages in at allocation
};

class HostResource final : public MemoryResource {
 public:
  HostResource() = default;
  explicit HostResource(HostResourceOptions options) : options_(options) {}

  std::string name() const override;
  const HostResourceOptions& options() const { return options_; }

  static constexpr std::size_t kPageSize = 4096;
  static constexpr std::size_t kHugePageSize = std::size_t{2} << 20;

 private:
  void* do_allocate(std::size_t bytes, Stream stream) override;
  void do_deallocate(void* ptr, std::size_t bytes, Stream stream) override;

  HostResourceOptions options_;
};

// Faults every page of the host memory [base, base + length) in, writable, so later first
// writes cost no page fault: MADV_POPULATE_WRITE (Linux 5.14) and then a zero byte written
// into each 4 KiB page, which also makes a lazily backed virtual machine's host supply the
// page - so only for memory whose contents do not matter yet. Returns false, with errno
// set, when the kernel cannot supply the pages.
bool prefault_host_pages(void* base, std::size_t length);

}  // namespace sdalloc
