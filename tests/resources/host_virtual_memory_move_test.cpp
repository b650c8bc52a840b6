// host_virtual_memory_move_test.cpp - HostVirtualMemory::move: mappings moved with their page
// tables (mremap), runs of chunks created in a row in one call, the old place reserved again,
// and misuse rejected before any system call.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/resources/host_virtual_memory.hpp"
#include "support/mapped_pages.hpp"

namespace sdalloc {
namespace {

using test::is_unmapped;
using test::kernel_mappings;
using test::present_pages;

constexpr std::size_t kPage = HostVirtualMemory::kPageSize;
constexpr std::size_t kChunk = 16 * kPage;  // 64 KiB, the pool's page on the host

char* at(void* base, std::size_t offset) { return static_cast<char*>(base) + offset; }

// Four chunks mapped at the start of a range, each filled with its own letter.
struct FourChunks {
  explicit FourChunks(HostVirtualMemory& m) : memory(m), base(m.reserve(16 * kChunk)) {
    for (int i = 0; i < 4; ++i) {
      chunks.push_back(memory.create(kChunk));
      memory.map(at(base, i * kChunk), chunks.back());
      std::memset(at(base, i * kChunk), 'a' + i, kChunk);
    }
  }
  // Chunk c moves into b's place and b, unless `back` is false, into c's: a and c become
  // neighbours whose handles do not follow each other (b goes through free space first).
  void swap_middle(bool back = true) {
    memory.move(at(base, kChunk), at(base, 10 * kChunk), &chunks[1], 1, Stream{});
    memory.move(at(base, 2 * kChunk), at(base, kChunk), &chunks[2], 1, Stream{});
    if (back) memory.move(at(base, 10 * kChunk), at(base, 2 * kChunk), &chunks[1], 1, Stream{});
  }
  // Letters of the chunks at `offset`, one per chunk ('?' where a chunk reads mixed).
  std::string letters(std::size_t offset, std::size_t count) const {
    return test::chunk_letters(at(base, offset), kChunk, count);
  }
  HostVirtualMemory& memory;
  void* base;
  std::vector<PhysicalChunk> chunks;
};

TEST(HostVirtualMemoryMove, MovesChunksWithTheirContentsAndPageTables) {
  HostVirtualMemory memory;
  if (!memory.can_move()) GTEST_SKIP() << "this kernel cannot move pages (Linux 5.7)";
  FourChunks four(memory);
  const std::size_t mappings = kernel_mappings();
  // The four were created and mapped in order: one kernel mapping, moved in one call.
  memory.move(four.base, at(four.base, 8 * kChunk), four.chunks.data(), 4, Stream{});
  EXPECT_EQ(four.letters(8 * kChunk, 4), "abcd");
  EXPECT_EQ(present_pages(at(four.base, 8 * kChunk), 4 * kChunk), 64u)
      << "the page tables came along: no fault on first use";
  EXPECT_EQ(present_pages(four.base, 4 * kChunk), 0u);
  EXPECT_FALSE(is_unmapped(four.base, 4 * kChunk)) << "the old place is reserved, not a hole";
  EXPECT_LE(kernel_mappings(), mappings + 1);
  EXPECT_EQ(memory.mapped_bytes(), 4 * kChunk);
  // The old place takes a mapping again; the moved chunks unmap where they are now.
  memory.map(four.base, memory.create(kChunk));
  EXPECT_THROW(memory.unmap(at(four.base, kChunk), kChunk, Stream{}), InvalidArgument);
  for (int i = 0; i < 4; ++i) memory.unmap(at(four.base, (8 + i) * kChunk), kChunk, Stream{});
  EXPECT_EQ(memory.mapped_bytes(), kChunk);
}

// Chunks whose handles do not follow each other (mapped in another order than created)
// move as well, a run of chunks created in a row per system call.
TEST(HostVirtualMemoryMove, ChunksOfScatteredExtentsMoveInOrder) {
  HostVirtualMemory memory;
  if (!memory.can_move()) GTEST_SKIP() << "this kernel cannot move pages (Linux 5.7)";
  FourChunks four(memory);
  four.swap_middle();
  EXPECT_EQ(four.letters(0, 4), "acbd");
  const PhysicalChunk order[] = {four.chunks[0], four.chunks[2], four.chunks[1], four.chunks[3]};
  memory.move(four.base, at(four.base, 5 * kChunk), order, 4, Stream{});
  EXPECT_EQ(four.letters(5 * kChunk, 4), "acbd");
  EXPECT_EQ(present_pages(at(four.base, 5 * kChunk), 4 * kChunk), 64u);
  EXPECT_EQ(memory.mapped_bytes(), 4 * kChunk);
}

// Chunks created one after another but first mapped apart are two kernel mappings even once
// they are neighbours (each keeps the place it was first mapped at in its mapping). A run of
// them still moves, in one call where the kernel takes it (Linux 6.17) or one per chunk.
TEST(HostVirtualMemoryMove, ARunOfSeveralKernelMappingsMoves) {
  HostVirtualMemory memory;
  if (!memory.can_move()) GTEST_SKIP() << "this kernel cannot move pages (Linux 5.7)";
  void* base = memory.reserve(16 * kChunk);
  const PhysicalChunk run[] = {memory.create(kChunk), memory.create(kChunk)};
  ASSERT_EQ(run[1].handle, run[0].handle + kChunk);
  memory.map(at(base, kChunk), run[1]);
  memory.map(at(base, 8 * kChunk), run[0]);
  std::memset(at(base, kChunk), 'y', kChunk);
  std::memset(at(base, 8 * kChunk), 'x', kChunk);
  memory.move(at(base, 8 * kChunk), base, &run[0], 1, Stream{});
  EXPECT_EQ(test::chunk_letters(base, kChunk, 2), "xy");
  memory.move(base, at(base, 4 * kChunk), run, 2, Stream{});
  EXPECT_EQ(test::chunk_letters(at(base, 4 * kChunk), kChunk, 2), "xy");
  EXPECT_EQ(present_pages(at(base, 4 * kChunk), 2 * kChunk), 32u);
  EXPECT_EQ(present_pages(base, 2 * kChunk), 0u);
  EXPECT_EQ(memory.mapped_bytes(), 2 * kChunk);
  memory.unmap(at(base, 4 * kChunk), kChunk, Stream{});
  memory.unmap(at(base, 5 * kChunk), kChunk, Stream{});
  memory.release(base, 16 * kChunk);
}

// Every misuse throws InvalidArgument and moves nothing.
TEST(HostVirtualMemoryMove, MisuseIsRejectedAndMovesNothing) {
  HostVirtualMemory memory;
  if (!memory.can_move()) GTEST_SKIP() << "this kernel cannot move pages (Linux 5.7)";
  FourChunks four(memory);
  void* other = memory.reserve(4 * kChunk);
  const PhysicalChunk* c = four.chunks.data();
  // Not the chunk mapped there / not mapped at all / a wrong size.
  EXPECT_THROW(memory.move(four.base, other, &c[1], 1, Stream{}), InvalidArgument);
  EXPECT_THROW(memory.move(other, four.base, c, 1, Stream{}), InvalidArgument);
  const PhysicalChunk half{c[0].handle, kChunk / 2};
  EXPECT_THROW(memory.move(four.base, other, &half, 1, Stream{}), InvalidArgument);
  // Onto a mapping (its own place included), outside any range, unaligned.
  EXPECT_THROW(memory.move(four.base, at(four.base, 2 * kChunk), c, 1, Stream{}), InvalidArgument);
  EXPECT_THROW(memory.move(four.base, at(four.base, kChunk / 2), c, 2, Stream{}), InvalidArgument);
  EXPECT_THROW(memory.move(four.base, at(other, 3 * kChunk + kChunk / 2), c, 1, Stream{}),
               InvalidArgument);
  EXPECT_THROW(memory.move(four.base, at(other, 3 * kChunk), c, 2, Stream{}), InvalidArgument)
      << "past the end of the range";
  EXPECT_THROW(memory.move(four.base, at(other, 1), c, 1, Stream{}), InvalidArgument);
  EXPECT_THROW(memory.move(four.base, other, nullptr, 1, Stream{}), InvalidArgument);
  memory.move(four.base, other, c, 0, Stream{});  // nothing to move
  EXPECT_EQ(four.letters(0, 4), "abcd");
  EXPECT_EQ(memory.mapped_bytes(), 4 * kChunk);
  for (int i = 0; i < 4; ++i) memory.unmap(at(four.base, i * kChunk), kChunk, Stream{});
}

// Makes the kernel refuse to move the mapping at [addr, addr + bytes) from now on, leaving
// it where it is: sealed (mseal, Linux 6.10), or else removed. A removed mapping is a hole,
// and any mmap of this process until the move (a sanitizer's own bookkeeping, say) may
// land in it and be moved in the test's place; a sealed one stays, and so does the range
// around it when the memory object is destroyed (munmap refuses sealed pages): the test's
// process ends soon after. Answers whether either worked.
bool refuse_moves_of(void* addr, std::size_t bytes) {
#ifdef SYS_mseal
  constexpr long kMseal = SYS_mseal;
#else
  constexpr long kMseal = 462;  // the same number on every 64-bit architecture
#endif
  return ::syscall(kMseal, addr, bytes, 0) == 0 || ::munmap(addr, bytes) == 0;
}

// A run the system refuses to move (here: its mapping was sealed, or removed, behind the
// object's back) fails the call with Error, and the runs moved before it go back: all or
// nothing.
TEST(HostVirtualMemoryMove, AMoveTheSystemRefusesIsUndone) {
  HostVirtualMemory memory;
  if (!memory.can_move()) GTEST_SKIP() << "this kernel cannot move pages (Linux 5.7)";
  FourChunks four(memory);
  four.swap_middle(/*back=*/false);  // a and c side by side: two runs of handles; b at 10
  void* other = memory.reserve(4 * kChunk);
  const PhysicalChunk pair[] = {four.chunks[0], four.chunks[2]};
  ASSERT_TRUE(refuse_moves_of(at(four.base, kChunk), kChunk));
  EXPECT_THROW(memory.move(four.base, other, pair, 2, Stream{}), Error);
  EXPECT_EQ(four.letters(0, 1), "a") << "the first run moved back";
  EXPECT_EQ(present_pages(other, 2 * kChunk), 0u);
  EXPECT_EQ(memory.mapped_bytes(), 4 * kChunk);
  EXPECT_NO_THROW(memory.unmap(four.base, kChunk, Stream{})) << "the tables say where a is";
  EXPECT_NO_THROW(memory.unmap(at(four.base, 10 * kChunk), kChunk, Stream{}));
}

TEST(HostVirtualMemoryMove, MovesCanBeTurnedOff) {
  HostVirtualMemory memory({.move_mappings = false});
  EXPECT_FALSE(memory.can_move());
  FourChunks four(memory);
  EXPECT_THROW(memory.move(four.base, at(four.base, 8 * kChunk), four.chunks.data(), 1, Stream{}),
               InvalidArgument);
  EXPECT_EQ(four.letters(0, 4), "abcd");
}

}  // namespace
}  // namespace sdalloc
