// mapped_pages.hpp - whether a range of the test process's address space is mapped, whose
// page tables are built, how many kernel mappings the process has, for tests that check a
// resource really gave memory back to the kernel, and what its pages hold.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace sdalloc::test {

inline unsigned char* bytes_of(void* ptr) { return static_cast<unsigned char*>(ptr); }

// How many 4 KiB pages of [ptr, ptr + bytes) hold `value` in their first byte: whose pages
// a range got (moved ones keep what was written, fresh ones are zero).
inline std::size_t pages_holding(void* ptr, std::size_t bytes, unsigned char value) {
  std::size_t n = 0;
  for (std::size_t off = 0; off < bytes; off += 4096) n += bytes_of(ptr)[off] == value ? 1 : 0;
  return n;
}

// True when no page of [ptr, ptr + bytes) is mapped any more (mincore fails with ENOMEM).
inline bool is_unmapped(void* ptr, std::size_t bytes) {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> residency(bytes / page + 1);
  return ::mincore(ptr, bytes, residency.data()) != 0 && errno == ENOMEM;
}

// 4 KiB pages of [base, base + bytes) whose page-table entry is present (/proc/self/pagemap,
// bit 63). Asked of the page tables, not counted as faults: a sanitizer's shadow memory
// faults on first use too, which made a fault count fail under ASan for pages that were
// present all along.
inline std::size_t present_pages(const void* base, std::size_t bytes) {
  const int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0) << "opening /proc/self/pagemap";
  std::vector<std::uint64_t> entries(bytes / 4096);
  const auto first = reinterpret_cast<std::uintptr_t>(base) / 4096;
  const std::size_t length = entries.size() * sizeof(std::uint64_t);
  EXPECT_EQ(::pread(fd, entries.data(), length, static_cast<off_t>(first * sizeof(std::uint64_t))),
            static_cast<ssize_t>(length))
      << "reading /proc/self/pagemap";
  ::close(fd);
  std::size_t present = 0;
  for (const std::uint64_t entry : entries) present += (entry >> 63) & 1;
  return present;
}

// Lines of /proc/self/maps: the kernel mappings (VMAs) of the process.
inline std::size_t kernel_mappings() {
  std::ifstream maps("/proc/self/maps");
  std::size_t lines = 0;
  for (std::string line; std::getline(maps, line);) ++lines;
  return lines;
}

// What `count` chunks of `chunk` bytes from `base` hold, one letter each: the first byte of
// every 4 KiB page of the chunk and its last byte when they all agree, else '?' (a chunk
// whose pages came from different places). For tests that fill each chunk with a letter of
// its own and move them.
inline std::string chunk_letters(const void* base, std::size_t chunk, std::size_t count) {
  std::string out;
  for (std::size_t i = 0; i < count; ++i) {
    const char* p = static_cast<const char*>(base) + i * chunk;
    char c = p[0];
    for (std::size_t b = 0; b < chunk; b += 4096) c = p[b] == c && p[chunk - 1] == c ? c : '?';
    out += c;
  }
  return out;
}

}  // namespace sdalloc::test
