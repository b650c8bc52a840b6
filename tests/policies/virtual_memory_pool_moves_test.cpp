// virtual_memory_pool_moves_test.cpp - how VirtualMemoryPool moves free pages under a
// request: by VirtualMemory::move where the memory can (a run of neighbours per call, from
// its own shard and from other idle shards), by unmap and map where it cannot, and what a
// move that fails leaves behind.
#include <gtest/gtest.h>

#include <cstddef>
#include <map>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/policies/virtual_memory_pool.hpp"
#include "sdalloc/resources/host_virtual_memory.hpp"
#include "support/fault_injection.hpp"
#include "support/holdings.hpp"

namespace sdalloc {
namespace {

using test::FaultInjectingVirtualMemory;
using test::FaultPlan;
using test::Holdings;
using test::ResourceCall;

constexpr std::size_t kKiB = std::size_t{1} << 10;
constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kBlock = 3 * kMiB / 2;  // a block of exactly 24 pages

// Ten blocks, every other one freed: 60 free pages in five gaps of 24, none of them big
// enough for the 96 pages of a 6 MiB request.
void ten_with_five_gaps(VirtualMemoryPool& pool, Holdings& held) {
  test::allocate_then_free_every_other(pool, held, 10, kBlock);
}

void free_all(VirtualMemoryPool& pool, Holdings& held) { test::deallocate_all(pool, held); }

// The same stitching as FragmentedFreePagesAreStitchedUnderANewRequest, on memory that does
// not move: each page is unmapped where it was and mapped under the request.
TEST(VirtualMemoryPoolMoves, WithoutMovesEachPageIsUnmappedAndMapped) {
  HostVirtualMemory memory({.move_mappings = false});
  ASSERT_FALSE(memory.can_move());
  EXPECT_THROW(memory.move(nullptr, nullptr, nullptr, 0, Stream{}), InvalidArgument);
  VirtualMemoryPool pool(memory);
  Holdings held;
  ten_with_five_gaps(pool, held);
  const VirtualMemoryPoolStats before = pool.vm_stats();
  void* big = pool.allocate(6 * kMiB);
  held.add(big, 6 * kMiB);
  const VirtualMemoryPoolStats after = pool.vm_stats();
  EXPECT_EQ(after.creates, before.creates) << "no new chunk: free pages were moved";
  EXPECT_EQ(after.remapped_pages - before.remapped_pages, 96u);
  EXPECT_EQ(after.unmaps - before.unmaps, 96u);
  EXPECT_EQ(after.maps - before.maps, 96u);
  EXPECT_EQ(after.moves, 0u);
  EXPECT_TRUE(held.intact());
  EXPECT_NO_THROW(pool.check_invariants());
  free_all(pool, held);
}

// Each stream has its own range; under a cap that allows no new chunk, a request on one
// stream takes another, idle stream's free pages, moved as runs while that stream's shard is
// locked for the request.
TEST(VirtualMemoryPoolMoves, AnotherShardsFreePagesMoveUnderARequest) {
  HostVirtualMemory memory;
  if (!memory.can_move()) GTEST_SKIP() << "this kernel cannot move shared mappings (Linux 5.13)";
  VirtualMemoryPool pool(memory, {.max_physical_bytes = 8 * kMiB});
  Holdings held;
  std::vector<void*> small;
  constexpr Stream kOther{5};
  for (int i = 0; i < 8; ++i) {
    small.push_back(pool.allocate(kMiB, 512, kOther));
    held.add(small.back(), kMiB);
  }
  void* kept = small[3];
  for (void* ptr : small) {
    if (ptr != kept) {
      held.remove(ptr);
      pool.free(ptr, kOther);
    }
  }
  const VirtualMemoryPoolStats before = pool.vm_stats();
  ASSERT_EQ(before.physical_bytes, 8 * kMiB) << "the cap is reached";
  void* large = pool.allocate(4 * kMiB);
  held.add(large, 4 * kMiB);
  const VirtualMemoryPoolStats after = pool.vm_stats();
  EXPECT_EQ(after.creates, before.creates);
  EXPECT_EQ(after.remapped_pages - before.remapped_pages, 64u) << "4 MiB of 64 KiB pages";
  EXPECT_EQ(after.unmaps, before.unmaps) << "moved, not unmapped and mapped";
  EXPECT_EQ(after.maps, before.maps);
  EXPECT_GE(after.moves - before.moves, 1u);
  EXPECT_LE(after.moves - before.moves, 2u) << "the free pages on either side of the kept MiB";
  EXPECT_TRUE(held.intact());
  EXPECT_NO_THROW(pool.check_invariants());
  free_all(pool, held);
  EXPECT_NO_THROW(pool.check_invariants());
}

// A move the system refuses (here: injected) fails the request and leaves the pool
// consistent: the pages not yet moved stay mapped where they were; those moved before the
// failure are unmapped under the request again and held as spare chunks (as the pages of a
// failed unmap-and-map attempt are); nothing is created or lost, and the next request
// moves and maps them.
TEST(VirtualMemoryPoolMoves, AFailedMoveLeavesThePoolConsistent) {
  HostVirtualMemory memory;
  if (!memory.can_move()) GTEST_SKIP() << "this kernel cannot move shared mappings (Linux 5.13)";
  FaultPlan plan;
  plan.count_only({ResourceCall::kMove});
  FaultInjectingVirtualMemory faulty(memory, plan);
  VirtualMemoryPool pool(faulty);
  Holdings held;
  ten_with_five_gaps(pool, held);
  const VirtualMemoryPoolStats before = pool.vm_stats();
  const PoolStats stats_before = pool.stats();
  for (std::uint64_t k : {0, 2}) {  // the first move, and one after two have succeeded
    plan.fail_call(plan.calls() + k);
    EXPECT_THROW((void)pool.allocate(6 * kMiB), Error) << "move " << k;
    plan.disarm();
    const VirtualMemoryPoolStats after = pool.vm_stats();
    if (k == 0) {
      EXPECT_EQ(after.mapped_bytes, before.mapped_bytes) << "nothing moved";
    }
    EXPECT_EQ(after.mapped_bytes + after.spare_bytes, before.mapped_bytes + before.spare_bytes)
        << "move " << k;
    EXPECT_EQ(after.physical_bytes, before.physical_bytes);
    EXPECT_EQ(after.creates, before.creates);
    EXPECT_EQ(pool.stats().live_bytes, stats_before.live_bytes);
    EXPECT_EQ(memory.mapped_bytes(), after.mapped_bytes) << "the tables match the memory";
    EXPECT_TRUE(held.intact());
    EXPECT_NO_THROW(pool.check_invariants());
  }
  void* big = pool.allocate(6 * kMiB);
  held.add(big, 6 * kMiB);
  EXPECT_EQ(pool.vm_stats().physical_bytes, before.physical_bytes);
  EXPECT_TRUE(held.intact());
  EXPECT_NO_THROW(pool.check_invariants());
  free_all(pool, held);
}

}  // namespace
}  // namespace sdalloc
