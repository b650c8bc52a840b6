// The drop-in's RangeVirtualMemory (mode:vmm): move() takes private pages to a new place with
// their page tables (mremap), the old place becomes reserved space again, a run that lies in
// several kernel mappings moves chunk by chunk, misuse is rejected, and a VirtualMemoryPool
// over it moves free pages under a request instead of unmapping and mapping them.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstddef>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "preload/address_range.hpp"
#include "sdalloc/core/errors.hpp"
#include "sdalloc/policies/virtual_memory_pool.hpp"
#include "support/holdings.hpp"
#include "support/mapped_pages.hpp"

namespace sdalloc::preload {
namespace {

using test::is_unmapped;
using test::present_pages;

constexpr std::size_t kPage = RangeVirtualMemory::kPageSize;
constexpr std::size_t kChunk = 16 * kPage;  // 64 KiB, the pool's page by default
constexpr std::size_t kMiB = std::size_t{1} << 20;

char* at(void* base, std::size_t offset) { return static_cast<char*>(base) + offset; }

struct Range {
  Range() { EXPECT_TRUE(reserved.reserve(std::size_t{1} << 30)); }  // the least it takes
  ReservedRange reserved;
};

// Chunks mapped one after another from `base`, each filled with its own letter.
struct Chunks {
  Chunks(RangeVirtualMemory& m, void* at_base, int count) : memory(m), base(at_base) {
    for (int i = 0; i < count; ++i) {
      chunks.push_back(memory.create(kChunk));
      memory.map(at(base, i * kChunk), chunks.back());
      std::memset(at(base, i * kChunk), 'a' + i, kChunk);
    }
  }
  // The letter of each chunk at `offset` ('?' where a chunk reads mixed).
  static std::string letters(void* base, std::size_t offset, std::size_t count) {
    return test::chunk_letters(at(base, offset), kChunk, count);
  }
  RangeVirtualMemory& memory;
  void* base;
  std::vector<PhysicalChunk> chunks;
};

// Memory that moves where the kernel can; the tests skip, saying why, where it cannot.
class RangeVirtualMemoryMove : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!memory.can_move()) GTEST_SKIP() << "this kernel cannot move private pages (Linux 5.7)";
  }
  Range range;
  RangeVirtualMemory memory{range.reserved, 0};
};

TEST_F(RangeVirtualMemoryMove, MovesPagesWithTheirContentsAndPageTables) {
  void* base = memory.reserve(16 * kChunk);
  Chunks four(memory, base, 4);
  FreshPages::of_this_thread().clear();
  memory.move(base, at(base, 8 * kChunk), four.chunks.data(), 4, Stream{});
  EXPECT_EQ(Chunks::letters(base, 8 * kChunk, 4), "abcd");
  EXPECT_EQ(present_pages(at(base, 8 * kChunk), 4 * kChunk), 64u)
      << "the page tables came along: no fault on first use";
  EXPECT_EQ(present_pages(base, 4 * kChunk), 0u);
  EXPECT_FALSE(is_unmapped(base, 4 * kChunk)) << "the old place is reserved, not a hole";
  const FreshPages& fresh = FreshPages::of_this_thread();
  EXPECT_EQ(fresh.begin, fresh.end) << "moved pages hold data: calloc must clear them";
  // The old place takes a mapping again (fresh zero pages).
  memory.map(base, four.chunks[0]);
  EXPECT_EQ(Chunks::letters(base, 0, 1), std::string(1, '\0'));
  memory.unmap(base, kChunk, Stream{});
  for (int i = 0; i < 4; ++i) memory.unmap(at(base, (8 + i) * kChunk), kChunk, Stream{});
  for (const PhysicalChunk& c : four.chunks) memory.destroy(c);
  memory.release(base, 16 * kChunk);
}

// A run of chunks is committed in one call, noted fresh for calloc as a whole; a run that
// does not lie wholly inside the range is refused before anything is mapped.
TEST(RangeVirtualMemory, MapRunCommitsARunOfFreshPagesAndRefusesOneOutsideTheRange) {
  Range range;
  RangeVirtualMemory memory{range.reserved, 0};
  ASSERT_TRUE(memory.maps_runs());
  void* base = memory.reserve(4 * kChunk);
  const PhysicalChunk run[] = {memory.create(kChunk), memory.create(kChunk), memory.create(kChunk)};
  FreshPages::of_this_thread().clear();
  memory.map_run(base, run, 3);
  const FreshPages& fresh = FreshPages::of_this_thread();
  EXPECT_EQ(fresh.begin, reinterpret_cast<std::uintptr_t>(base));
  EXPECT_EQ(fresh.end - fresh.begin, 3 * kChunk);
  std::memset(base, 'r', 3 * kChunk);
  const auto end = reinterpret_cast<void*>(range.reserved.base() + range.reserved.size());
  EXPECT_THROW(memory.map_run(at(end, 0) - kChunk, run, 2), InvalidArgument);
  EXPECT_THROW(memory.map_run(base, nullptr, 1), InvalidArgument);
  for (int i = 0; i < 3; ++i) memory.unmap(at(base, i * kChunk), kChunk, Stream{});
  memory.release(base, 4 * kChunk);
}

// Pages moved in from elsewhere keep a kernel mapping of their own beside their new
// neighbours (another anon_vma). Linux 6.17 and later move such a run in one mremap; before,
// it answers EFAULT and the run moves chunk by chunk. Either way it arrives whole.
TEST_F(RangeVirtualMemoryMove, ARunOverSeveralKernelMappingsMoves) {
  void* base = memory.reserve(16 * kChunk);
  void* elsewhere = memory.reserve(4 * kChunk);
  Chunks a(memory, base, 1);
  Chunks b(memory, elsewhere, 2);  // 'a', 'b' there
  memory.move(at(elsewhere, kChunk), at(base, kChunk), &b.chunks[1], 1, Stream{});
  ASSERT_EQ(Chunks::letters(base, 0, 2), "ab");
  const PhysicalChunk pair[] = {a.chunks[0], b.chunks[1]};
  memory.move(base, at(base, 6 * kChunk), pair, 2, Stream{});
  EXPECT_EQ(Chunks::letters(base, 6 * kChunk, 2), "ab");
  EXPECT_EQ(present_pages(at(base, 6 * kChunk), 2 * kChunk), 32u);
  EXPECT_EQ(present_pages(base, 2 * kChunk), 0u);
  EXPECT_FALSE(is_unmapped(base, 2 * kChunk));
  memory.unmap(at(base, 6 * kChunk), 2 * kChunk, Stream{});
  memory.unmap(elsewhere, kChunk, Stream{});
}

// The kernel's answers, scripted: a whole run (more than one chunk) is refused, as a run over
// several kernel mappings is before Linux 6.17; call number `refused_call` is refused with
// `refusal`; every other call moves.
struct ScriptedMover {
  static inline int calls = 0;
  static inline int refused_call = 0;  // 0: none
  static inline int refusal = 0;
  static int move(std::uintptr_t from, std::uintptr_t to, std::size_t bytes) {
    ++calls;
    if (bytes > kChunk) return EFAULT;
    if (calls == refused_call) return refusal;
    return RangeVirtualMemory::move_private_pages(from, to, bytes);
  }
};

// A run the kernel will not move in one call moves chunk by chunk; a chunk it refuses fails
// the call (OutOfMemory for ENOMEM, Error otherwise) after the chunks before it moved, and
// they go back: all or nothing.
TEST(RangeVirtualMemoryMoves, ChunkByChunkWhereTheRunIsRefusedAndUndoneWhereAChunkIs) {
  Range range;
  RangeVirtualMemory memory(range.reserved, 0, true, &ScriptedMover::move);
  if (!memory.can_move()) GTEST_SKIP() << "this kernel cannot move private pages (Linux 5.7)";
  void* base = memory.reserve(16 * kChunk);
  Chunks three(memory, base, 3);
  // Refused as a run, moved chunk by chunk.
  ScriptedMover::calls = 0;
  ScriptedMover::refused_call = 0;
  memory.move(base, at(base, 4 * kChunk), three.chunks.data(), 3, Stream{});
  EXPECT_EQ(ScriptedMover::calls, 4);
  EXPECT_EQ(Chunks::letters(base, 4 * kChunk, 3), "abc");
  EXPECT_EQ(present_pages(base, 3 * kChunk), 0u);
  // The third chunk refused: the two before it go back, in reverse.
  for (const int refusal : {ENOMEM, EINVAL}) {
    ScriptedMover::calls = 0;
    ScriptedMover::refused_call = 4;  // the run, two chunks, then the third
    ScriptedMover::refusal = refusal;
    if (refusal == ENOMEM) {
      EXPECT_THROW(memory.move(at(base, 4 * kChunk), at(base, 10 * kChunk), three.chunks.data(), 3,
                               Stream{}),
                   OutOfMemory);
    } else {
      try {
        memory.move(at(base, 4 * kChunk), at(base, 10 * kChunk), three.chunks.data(), 3, Stream{});
        ADD_FAILURE() << "the refused move went through";
      } catch (const OutOfMemory&) {
        ADD_FAILURE() << "EINVAL is not a lack of memory";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("mremap"), std::string::npos) << e.what();
      }
    }
    EXPECT_EQ(ScriptedMover::calls, 1 + 3 + 2) << "the run, three chunks, two moved back";
    EXPECT_EQ(Chunks::letters(base, 4 * kChunk, 3), "abc");
    EXPECT_EQ(present_pages(at(base, 4 * kChunk), 3 * kChunk), 48u) << "their page tables too";
    EXPECT_EQ(present_pages(at(base, 10 * kChunk), 3 * kChunk), 0u);
    EXPECT_FALSE(is_unmapped(at(base, 10 * kChunk), 3 * kChunk)) << "reserved, not a hole";
  }
  memory.unmap(at(base, 4 * kChunk), 3 * kChunk, Stream{});
}

// Every misuse throws InvalidArgument and moves nothing.
TEST_F(RangeVirtualMemoryMove, MisuseIsRejectedAndMovesNothing) {
  void* base = memory.reserve(8 * kChunk);
  Chunks two(memory, base, 2);
  const PhysicalChunk* c = two.chunks.data();
  std::vector<char> outside(2 * kChunk + kPage);
  char* foreign = reinterpret_cast<char*>(
      (reinterpret_cast<std::uintptr_t>(outside.data()) + kPage - 1) & ~(kPage - 1));
  EXPECT_THROW(memory.move(base, foreign, c, 1, Stream{}), InvalidArgument) << "outside the range";
  EXPECT_THROW(memory.move(foreign, base, c, 1, Stream{}), InvalidArgument);
  EXPECT_THROW(memory.move(base, at(base, kChunk), c, 2, Stream{}), InvalidArgument) << "overlap";
  EXPECT_THROW(memory.move(base, at(base, 4 * kChunk + 1), c, 1, Stream{}), InvalidArgument);
  EXPECT_THROW(memory.move(base, at(base, 4 * kChunk), nullptr, 1, Stream{}), InvalidArgument);
  const PhysicalChunk odd{c[0].handle, kPage / 2};
  EXPECT_THROW(memory.move(base, at(base, 4 * kChunk), &odd, 1, Stream{}), InvalidArgument);
  memory.move(base, at(base, 4 * kChunk), c, 0, Stream{});  // nothing to move
  EXPECT_EQ(Chunks::letters(base, 0, 2), "ab");
  memory.unmap(base, 2 * kChunk, Stream{});
}

TEST(RangeVirtualMemoryMoves, CanBeTurnedOff) {
  Range range;
  RangeVirtualMemory memory(range.reserved, 0, /*moves=*/false);
  EXPECT_FALSE(memory.can_move());
  void* base = memory.reserve(8 * kChunk);
  Chunks one(memory, base, 1);
  EXPECT_THROW(memory.move(base, at(base, 4 * kChunk), one.chunks.data(), 1, Stream{}),
               InvalidArgument);
  EXPECT_EQ(Chunks::letters(base, 0, 1), "a");
  memory.unmap(base, kChunk, Stream{});
}

// The pool over it: ten blocks of 24 pages with every other one freed leave 60 free pages
// in gaps no 6 MiB request fits; the request's 96 pages are moved there (as runs), none
// unmapped, and with moves off every page is unmapped and mapped instead.
TEST(RangeVirtualMemoryMoves, APoolMovesFreePagesUnderARequest) {
  for (const bool moves : {true, false}) {
    Range range;
    RangeVirtualMemory memory(range.reserved, 0, moves);
    if (moves && !memory.can_move()) continue;
    // Ranges come out of the one reservation, as the drop-in makes them (preload_runtime.cpp).
    VirtualMemoryPool pool(memory, {.range_size = range.reserved.size() / 8});
    test::Holdings held;
    test::allocate_then_free_every_other(pool, held, 10, 3 * kMiB / 2);
    const VirtualMemoryPoolStats before = pool.vm_stats();
    void* big = pool.allocate(6 * kMiB);
    held.add(big, 6 * kMiB);
    const VirtualMemoryPoolStats after = pool.vm_stats();
    EXPECT_EQ(after.creates, before.creates) << "no new chunk: free pages were taken";
    EXPECT_EQ(after.remapped_pages - before.remapped_pages, 96u);
    if (moves) {
      EXPECT_GT(after.moves, before.moves);
      EXPECT_EQ(after.unmaps, before.unmaps);
    } else {
      EXPECT_EQ(after.moves, 0u);
      EXPECT_EQ(after.unmaps - before.unmaps, 96u);
    }
    EXPECT_TRUE(held.intact());
    EXPECT_NO_THROW(pool.check_invariants());
    test::deallocate_all(pool, held);
  }
}

}  // namespace
}  // namespace sdalloc::preload
