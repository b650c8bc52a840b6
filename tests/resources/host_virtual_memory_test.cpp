// host_virtual_memory_test.cpp - HostVirtualMemory: ranges, chunks, mappings, misuse.
#include "sdalloc/resources/host_virtual_memory.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "sdalloc/core/errors.hpp"
#include "support/mapped_pages.hpp"
#include "support/test_support.hpp"

namespace sdalloc {
namespace {

using test::Contains;
using test::kernel_mappings;
using test::present_pages;

constexpr std::size_t kPage = HostVirtualMemory::kPageSize;
constexpr std::size_t kChunk = 16 * kPage;

char* at(void* base, std::size_t offset) { return static_cast<char*>(base) + offset; }

TEST(HostVirtualMemory, MappedChunkIsWritableAndNewChunksReadAsZeros) {
  HostVirtualMemory memory;
  EXPECT_EQ(memory.granularity(), kPage);
  void* base = memory.reserve(4 * kChunk);
  ASSERT_NE(base, nullptr);
  EXPECT_EQ(memory.reserved_bytes(), 4 * kChunk);
  const PhysicalChunk chunk = memory.create(kChunk);
  EXPECT_EQ(chunk.bytes, kChunk);
  EXPECT_EQ(memory.physical_bytes(), kChunk);
  memory.map(at(base, kChunk), chunk);
  EXPECT_EQ(memory.mapped_bytes(), kChunk);
  for (std::size_t i = 0; i < kChunk; i += 512) EXPECT_EQ(*at(base, kChunk + i), 0);
  std::memset(at(base, kChunk), 0x5a, kChunk);
  memory.unmap(at(base, kChunk), kChunk, Stream{});
  memory.destroy(chunk);
  // The extent is reused, punched out: zeros again.
  const PhysicalChunk again = memory.create(kChunk);
  memory.map(base, again);
  for (std::size_t i = 0; i < kChunk; i += 512) ASSERT_EQ(*at(base, i), 0) << i;
  memory.unmap(base, kChunk, Stream{});
  memory.destroy(again);
  memory.release(base, 4 * kChunk);
  EXPECT_EQ(memory.physical_bytes(), 0u);
  EXPECT_EQ(memory.mapped_bytes(), 0u);
  EXPECT_EQ(memory.reserved_bytes(), 0u);
}

// A chunk mapped again is a page moving: its page tables are built in the map call
// (MAP_POPULATE), so using it where it now lies faults nothing; the first map does not
// populate (pages nobody writes would otherwise be allocated).
// A run of chunks maps side by side in one call (one kernel mapping), each unmapped on its
// own later; a run with a chunk that breaks the rules maps none of them.
TEST(HostVirtualMemory, MapRunMapsChunksSideBySideAllOrNothing) {
  HostVirtualMemory memory;
  ASSERT_TRUE(memory.maps_runs());
  void* base = memory.reserve(8 * kChunk);
  std::vector<PhysicalChunk> run;
  for (int i = 0; i < 4; ++i) run.push_back(memory.create(kChunk));
  const std::size_t mappings = kernel_mappings();
  memory.map_run(base, run.data(), run.size());
  EXPECT_EQ(memory.mapped_bytes(), 4 * kChunk);
  EXPECT_LE(kernel_mappings(), mappings + 2);
  std::memset(base, 'r', 4 * kChunk);
  memory.unmap(at(base, kChunk), kChunk, Stream{});  // one chunk of the run on its own
  EXPECT_EQ(memory.mapped_bytes(), 3 * kChunk);
  EXPECT_EQ(*at(base, 2 * kChunk), 'r');
  // A run whose second chunk is still mapped elsewhere: refused, nothing mapped.
  const PhysicalChunk bad[] = {run[1], run[2]};
  EXPECT_THROW(memory.map_run(at(base, 4 * kChunk), bad, 2), InvalidArgument);
  EXPECT_EQ(memory.mapped_bytes(), 3 * kChunk);
  // A run past the end of the range: refused, nothing mapped.
  const PhysicalChunk spare[] = {run[1], memory.create(kChunk)};
  EXPECT_THROW(memory.map_run(at(base, 7 * kChunk), spare, 2), InvalidArgument);
  EXPECT_EQ(memory.mapped_bytes(), 3 * kChunk);
  EXPECT_THROW(memory.map_run(base, nullptr, 1), InvalidArgument);
  EXPECT_NO_THROW(memory.map_run(base, nullptr, 0));
  memory.map_run(at(base, 6 * kChunk), spare, 2);
  EXPECT_EQ(memory.mapped_bytes(), 5 * kChunk);
  for (const std::size_t c : {0, 2, 3, 6, 7}) memory.unmap(at(base, c * kChunk), kChunk, Stream{});
  memory.release(base, 8 * kChunk);
}

// An unmapped chunk holds no memory: its pages are freed at unmap, and mapped again (here
// or elsewhere) it is fresh zero pages, faulted in where written.
TEST(HostVirtualMemory, UnmapFreesThePagesAndAChunkMappedAgainReadsAsZeros) {
  HostVirtualMemory memory;
  const std::size_t bytes = 64 * kPage;
  void* base = memory.reserve(2 * bytes);
  const PhysicalChunk chunk = memory.create(bytes);
  memory.map(base, chunk);
  EXPECT_EQ(present_pages(base, bytes), 0u) << "a map builds no page tables";
  std::memset(base, 0x3c, bytes);
  EXPECT_EQ(present_pages(base, bytes), 64u);
  memory.unmap(base, bytes, Stream{});
  EXPECT_EQ(present_pages(base, bytes), 0u);
  memory.map(at(base, bytes), chunk);
  EXPECT_EQ(present_pages(at(base, bytes), bytes), 0u);
  long sum = 0;
  for (std::size_t i = 0; i < bytes; i += kPage) sum += *at(base, bytes + i);
  EXPECT_EQ(sum, 0);
  memory.unmap(at(base, bytes), bytes, Stream{});
  memory.destroy(chunk);
  memory.release(base, 2 * bytes);
}

// A fork()ed child gets the pool's pages copy-on-write, as it gets the heap: what it writes
// stays its own (shared pages would let a worker process overwrite its parent's tensors).
TEST(HostVirtualMemory, AForkedChildWritesItsOwnCopy) {
  HostVirtualMemory memory;
  void* base = memory.reserve(kChunk);
  const PhysicalChunk chunk = memory.create(kChunk);
  memory.map(base, chunk);
  std::memset(base, 'p', kChunk);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const bool saw_parent = *at(base, kChunk - 1) == 'p';
    std::memset(base, 'c', kChunk);
    ::_exit(saw_parent ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child reads what the parent wrote before fork()";
  for (std::size_t i = 0; i < kChunk; i += 64) ASSERT_EQ(*at(base, i), 'p') << i;
  memory.unmap(base, kChunk, Stream{});
  memory.destroy(chunk);
  memory.release(base, kChunk);
}

TEST(HostVirtualMemory, ReserveHonoursAlignment) {
  HostVirtualMemory memory;
  constexpr std::size_t kAlignment = std::size_t{2} << 20;
  void* base = memory.reserve(kChunk, kAlignment);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(base) % kAlignment, 0u);
  memory.release(base, kChunk);
  EXPECT_THROW((void)memory.reserve(kChunk, 3 * kPage), InvalidArgument);
}

TEST(HostVirtualMemory, MisuseIsRejectedBeforeAnySystemCall) {
  HostVirtualMemory memory;
  void* base = memory.reserve(4 * kChunk);
  const PhysicalChunk chunk = memory.create(kChunk);
  memory.map(base, chunk);
  std::memset(base, 7, kChunk);
  const PhysicalChunk other = memory.create(kChunk);

  auto expect_invalid = [](const std::string& what, auto&& call, const std::string& part) {
    SCOPED_TRACE(what);
    try {
      call();
      ADD_FAILURE() << what << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_TRUE(Contains(e.what(), part));
    }
  };
  expect_invalid(
      "zero-size reserve", [&] { (void)memory.reserve(0); }, "multiple of 4096");
  expect_invalid(
      "odd-size create", [&] { (void)memory.create(kPage + 1); }, "multiple of 4096");
  expect_invalid(
      "map over a mapping", [&] { memory.map(at(base, kPage), other); }, "overlaps");
  expect_invalid(
      "map of a mapped chunk", [&] { memory.map(at(base, kChunk), chunk); }, "already mapped");
  expect_invalid(
      "map outside any range", [&] { memory.map(at(base, 4 * kChunk), other); },
      "inside a reserved range");
  expect_invalid(
      "map across the end of a range", [&] { memory.map(at(base, 3 * kChunk + kPage), other); },
      "inside a reserved range");
  expect_invalid(
      "unaligned map", [&] { memory.map(at(base, kChunk + 8), other); }, "page-aligned");
  expect_invalid(
      "map of an unknown chunk",
      [&] {
        memory.map(at(base, kChunk), {12345, kChunk});
      },
      "not a chunk created here");
  expect_invalid(
      "unmap of a part of a mapping", [&] { memory.unmap(base, kPage, Stream{}); },
      "not a mapping");
  expect_invalid(
      "unmap where nothing is mapped", [&] { memory.unmap(at(base, kChunk), kChunk, Stream{}); },
      "not a mapping");
  expect_invalid(
      "destroy of a mapped chunk", [&] { memory.destroy(chunk); }, "while it is mapped");
  expect_invalid(
      "release with mappings", [&] { memory.release(base, 4 * kChunk); }, "still mapped");
  expect_invalid(
      "release of a part of a range", [&] { memory.release(base, kChunk); },
      "not a range reserved here");

  // Nothing changed: the mapping still holds its bytes, and the figures are as before.
  for (std::size_t i = 0; i < kChunk; i += 256) ASSERT_EQ(*at(base, i), 7);
  EXPECT_EQ(memory.mapped_bytes(), kChunk);
  EXPECT_EQ(memory.physical_bytes(), 2 * kChunk);
  memory.map(at(base, kChunk), other);  // the right call still works
  memory.unmap(at(base, kChunk), kChunk, Stream{});
  memory.unmap(base, kChunk, Stream{});
  memory.destroy(chunk);
  memory.destroy(other);
  memory.release(base, 4 * kChunk);
}

TEST(HostVirtualMemory, PhysicalLimitFailsCreateWithOutOfMemory) {
  HostVirtualMemory memory({.physical_limit = 2 * kChunk});
  EXPECT_EQ(memory.physical_capacity(), 2 * kChunk);
  const PhysicalChunk a = memory.create(kChunk);
  const PhysicalChunk b = memory.create(kChunk);
  try {
    (void)memory.create(kPage);
    ADD_FAILURE() << "created past the limit";
  } catch (const OutOfMemory& e) {
    EXPECT_EQ(e.info.requested, kPage);
    EXPECT_EQ(e.info.capacity, 2 * kChunk);
    EXPECT_TRUE(Contains(e.what(), "available"));
  }
  memory.destroy(a);
  EXPECT_NO_THROW(memory.destroy(memory.create(kChunk)));
  memory.destroy(b);
  EXPECT_THROW(HostVirtualMemory({.physical_limit = kPage + 1}), InvalidArgument);
}

// The process's kernel mappings now: one line of /proc/self/maps each.

// Issue 15, F3: one mapping per chunk hit vm.max_map_count (65,530) at about 4 GiB of
// 64 KiB chunks. Fresh pages mapped at adjacent addresses are merged by the kernel into one
// mapping. 8 GiB of sparse pages (never written: no memory) would be 131,072 mappings
// otherwise.
TEST(HostVirtualMemory, F3AdjacentChunksMappedInOrderShareOneKernelMapping) {
  constexpr std::size_t kBig = 64 * 1024;
  constexpr std::size_t kCount = (std::size_t{8} << 30) / kBig;
  HostVirtualMemory memory;
  void* base = memory.reserve(kCount * kBig);
  const std::size_t before = kernel_mappings();
  std::vector<PhysicalChunk> chunks;
  chunks.reserve(kCount);
  for (std::size_t i = 0; i < kCount; ++i) {
    chunks.push_back(memory.create(kBig));
    memory.map(at(base, i * kBig), chunks.back());
  }
  EXPECT_EQ(memory.mapped_bytes(), kCount * kBig);
  EXPECT_LE(kernel_mappings(), before + 2);
  // Unmapping one in the middle splits the mapping; mapping it back merges it again.
  memory.unmap(at(base, 100 * kBig), kBig, Stream{});
  EXPECT_LE(kernel_mappings(), before + 4);
  memory.map(at(base, 100 * kBig), chunks[100]);
  EXPECT_LE(kernel_mappings(), before + 2);
  for (std::size_t i = 0; i < kCount; ++i) memory.unmap(at(base, i * kBig), kBig, Stream{});
  for (const PhysicalChunk& chunk : chunks) memory.destroy(chunk);
  memory.release(base, kCount * kBig);
  EXPECT_EQ(memory.physical_bytes(), 0u);
}

// Chunks created one after another have handles that follow each other (handle + bytes),
// which is how a caller tells which chunks move together in one call.
TEST(HostVirtualMemory, ChunksCreatedInARowHaveHandlesThatFollowEachOther) {
  HostVirtualMemory memory;
  std::vector<PhysicalChunk> chunks;
  for (int i = 0; i < 4; ++i) chunks.push_back(memory.create(kChunk));
  for (int i = 1; i < 4; ++i) EXPECT_EQ(chunks[i].handle, chunks[i - 1].handle + kChunk);
  memory.destroy(chunks[1]);
  const PhysicalChunk next = memory.create(kChunk);
  EXPECT_NE(next.handle, chunks[1].handle) << "a handle names one chunk only, ever";
  EXPECT_EQ(memory.physical_bytes(), 4 * kChunk);
}

TEST(HostVirtualMemory, DestructorReleasesWhatWasLeft) {
  auto memory = std::make_unique<HostVirtualMemory>();
  void* base = memory->reserve(kChunk);
  memory->map(base, memory->create(kChunk));
  std::memset(base, 1, kChunk);
  EXPECT_NO_THROW(memory.reset());
}

TEST(HostVirtualMemory, PopulateOptionPrefaultsMappedPages) {
  HostVirtualMemory memory({.populate = true});
  EXPECT_TRUE(Contains(memory.name(), "populate"));
  void* base = memory.reserve(kChunk);
  const PhysicalChunk chunk = memory.create(kChunk);
  memory.map(base, chunk);
  for (std::size_t i = 0; i < kChunk; i += kPage) EXPECT_EQ(*at(base, i), 0);
  memory.unmap(base, kChunk, Stream{});
  memory.destroy(chunk);
  memory.release(base, kChunk);
}

}  // namespace
}  // namespace sdalloc
