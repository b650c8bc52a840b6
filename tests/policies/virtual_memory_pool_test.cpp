// virtual_memory_pool_test.cpp - VirtualMemoryPool: pages on demand, stitching, the cap,
// the out-of-memory path, trim, and failures injected at every VirtualMemory step.
#include "sdalloc/policies/virtual_memory_pool.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "conformance/controlled_stream_events.hpp"
#include "sdalloc/core/errors.hpp"
#include "sdalloc/resources/host_virtual_memory.hpp"
#include "support/failing_virtual_memory.hpp"
#include "support/holdings.hpp"
#include "support/test_support.hpp"

namespace sdalloc {
namespace {

using test::Contains;
using test::FailingVirtualMemory;
using test::Holdings;
using Step = FailingVirtualMemory::Step;
using Failure = FailingVirtualMemory::Failure;

constexpr std::size_t kKiB = std::size_t{1} << 10;
constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kPage = 64 * kKiB;      // the default page size on the host
constexpr std::size_t kBlock = 3 * kMiB / 2;  // a block of exactly 24 pages

// Ten kBlock blocks, every other one freed again: 60 free pages in five gaps of 24, none big
// enough for a 6 MiB request (96 pages). Answers the ten pointers (the even ones freed).
std::vector<void*> allocate_ten_and_free_every_other(VirtualMemoryPool& pool, Holdings& held) {
  return test::allocate_then_free_every_other(pool, held, 10, kBlock);
}

// The figures a failed call must leave as they were.
struct Snapshot {
  explicit Snapshot(const VirtualMemoryPool& pool) : stats(pool.stats()), vm(pool.vm_stats()) {}
  PoolStats stats;
  VirtualMemoryPoolStats vm;
};

void expect_unchanged(const Snapshot& before, const VirtualMemoryPool& pool) {
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.live_bytes, before.stats.live_bytes);
  EXPECT_EQ(s.live_allocations, before.stats.live_allocations);
  EXPECT_EQ(s.allocated_bytes, before.stats.allocated_bytes);
  EXPECT_EQ(s.allocations, before.stats.allocations);
  EXPECT_EQ(s.frees, before.stats.frees);
  EXPECT_EQ(s.reserved_bytes, before.stats.reserved_bytes) << "physical bytes held";
  EXPECT_EQ(s.segments, before.stats.segments) << "chunks held";
}

// ---- pages on demand and stitching ---------------------------------------------------------

TEST(VirtualMemoryPool, MapsPagesOnlyWhereAllocationsLie) {
  HostVirtualMemory memory;
  VirtualMemoryPool pool(memory);
  EXPECT_EQ(pool.vm_stats().physical_bytes, 0u) << "nothing before the first request";
  void* ptr = pool.allocate(5 * kMiB);
  std::memset(ptr, 1, 5 * kMiB);
  const VirtualMemoryPoolStats s = pool.vm_stats();
  EXPECT_EQ(s.mapped_bytes, 5 * kMiB) << "5 MiB is 80 whole pages";
  EXPECT_EQ(s.physical_bytes, 5 * kMiB);
  EXPECT_EQ(s.maps, 80u);
  EXPECT_EQ(s.ranges, 1u);
  EXPECT_EQ(s.address_space_bytes, pool.options().range_size);
  EXPECT_EQ(memory.mapped_bytes(), s.mapped_bytes);
  pool.deallocate(ptr, 5 * kMiB);
  // A warm pool serves the same request again without a map call.
  void* again = pool.allocate(5 * kMiB);
  EXPECT_EQ(again, ptr);
  EXPECT_EQ(pool.vm_stats().maps, 80u);
  pool.deallocate(again, 5 * kMiB);
  EXPECT_NO_THROW(pool.check_invariants());
}

// One range per stream, whatever the size: a small block and a large one share it, and
// each other's pages.
TEST(VirtualMemoryPool, RequestsOfEverySizeShareTheStreamsRange) {
  HostVirtualMemory memory;
  VirtualMemoryPool pool(memory);
  void* small = pool.allocate(4 * kKiB);
  void* large = pool.allocate(4 * kMiB);
  const auto distance =
      reinterpret_cast<std::uintptr_t>(large) > reinterpret_cast<std::uintptr_t>(small)
          ? reinterpret_cast<std::uintptr_t>(large) - reinterpret_cast<std::uintptr_t>(small)
          : reinterpret_cast<std::uintptr_t>(small) - reinterpret_cast<std::uintptr_t>(large);
  EXPECT_LT(distance, 8 * kMiB) << "neighbours in one range";
  EXPECT_EQ(pool.vm_stats().ranges, 1u);
  void* other = pool.allocate(4 * kKiB, 512, Stream{7});
  EXPECT_EQ(pool.vm_stats().ranges, 2u) << "another stream, another range";
  pool.free(other, Stream{7});
  pool.free(small);
  pool.free(large);
}

// Ten blocks, every other one freed: 60 free pages in five gaps of 24, none big enough for
// a 6 MiB request (96 pages). The pool must move free pages under the new request rather
// than create chunks, and no live block may lose a byte. HostVirtualMemory moves them
// (mremap), a run of neighbours per call; without moves (virtual_memory_pool_moves_test.cpp)
// each page is unmapped and mapped.
TEST(VirtualMemoryPool, FragmentedFreePagesAreStitchedUnderANewRequest) {
  HostVirtualMemory memory;
  VirtualMemoryPool pool(memory);
  Holdings held;
  std::vector<void*> blocks = allocate_ten_and_free_every_other(pool, held);
  // 4 more pages of room: 5 x 24 = 120 free pages, 96 needed.
  const VirtualMemoryPoolStats before = pool.vm_stats();
  void* big = pool.allocate(6 * kMiB);
  held.add(big, 6 * kMiB);
  const VirtualMemoryPoolStats after = pool.vm_stats();
  EXPECT_EQ(after.creates, before.creates) << "no new chunk: free pages were moved";
  EXPECT_EQ(after.physical_bytes, before.physical_bytes);
  EXPECT_EQ(after.remapped_pages - before.remapped_pages, 96u);
  if (memory.can_move()) {
    EXPECT_EQ(after.unmaps - before.unmaps, 0u);
    EXPECT_EQ(after.maps - before.maps, 0u);
    EXPECT_GE(after.moves - before.moves, 4u) << "from the five gaps";
    EXPECT_LE(after.moves - before.moves, 5u) << "a gap's pages in one call";
  } else {  // Linux before 5.13
    EXPECT_EQ(after.unmaps - before.unmaps, 96u);
    EXPECT_EQ(after.maps - before.maps, 96u);
  }
  EXPECT_TRUE(held.intact());
  EXPECT_NO_THROW(pool.check_invariants());
  // The freed gaps are still usable: their remaining pages, or pages mapped again.
  for (int i = 0; i < 10; i += 2) {
    blocks[i] = pool.allocate(kBlock);
    held.add(blocks[i], kBlock);
  }
  EXPECT_TRUE(held.intact());
  EXPECT_LE(pool.vm_stats().peak_physical_bytes, 16 * kMiB + 6 * kMiB);
  test::deallocate_all(pool, held);
  EXPECT_NO_THROW(pool.check_invariants());
}

// Random sizes under a tight cap, every byte checked after every step: the pool moves pages
// constantly, and a page moved from under a live allocation (or mapped under two) shows.
TEST(VirtualMemoryPool, RemappedPagesNeverAliasLiveAllocations) {
  HostVirtualMemory memory;
  constexpr std::size_t kCap = 24 * kMiB;
  VirtualMemoryPool pool(memory, {.max_physical_bytes = kCap, .page_size = 16 * kKiB});
  Holdings held;
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<std::size_t> small(1, 256 * kKiB);
  std::uniform_int_distribution<std::size_t> large(kMiB, 6 * kMiB);
  std::size_t ooms = 0;
  for (int step = 0; step < 600; ++step) {
    if (!held.empty() && (rng() % 5 < 2 || pool.stats().live_bytes > kCap * 3 / 4)) {
      auto it = held.all().begin();
      std::advance(it, static_cast<long>(rng() % held.all().size()));
      void* ptr = it->first;
      pool.deallocate(ptr, held.remove(ptr));
    } else {
      const std::size_t size = rng() % 3 == 0 ? large(rng) : small(rng);
      try {
        held.add(pool.allocate(size), size);
      } catch (const OutOfMemory& e) {
        ++ooms;
        EXPECT_TRUE(Contains(e.what(), "mapped"));
      }
    }
    ASSERT_TRUE(held.intact()) << "step " << step;
    if (step % 50 == 0) {
      ASSERT_NO_THROW(pool.check_invariants()) << "step " << step;
    }
  }
  const VirtualMemoryPoolStats s = pool.vm_stats();
  EXPECT_LE(s.peak_physical_bytes, kCap);
  EXPECT_GT(s.remapped_pages, 0u) << "the cap must have forced pages to move";
  RecordProperty("ooms", std::to_string(ooms));
  test::deallocate_all(pool, held);
  EXPECT_NO_THROW(pool.check_invariants());
}

// ---- the cap and the out-of-memory path -----------------------------------------------------

TEST(VirtualMemoryPool, AtTheCapFreePagesAreRemappedBeforeFailing) {
  HostVirtualMemory memory;
  // Growing freely below the cap (remap_before_growth off), so only the OOM path moves pages.
  VirtualMemoryPool pool(memory, {.max_physical_bytes = 10 * kBlock, .remap_before_growth = false});
  Holdings held;
  allocate_ten_and_free_every_other(pool, held);
  void* big = pool.allocate(6 * kMiB);  // 96 pages, 60 free ones to move, cap reached
  held.add(big, 6 * kMiB);
  EXPECT_TRUE(held.intact());
  EXPECT_EQ(pool.vm_stats().physical_bytes, 10 * kBlock);
  EXPECT_EQ(pool.stats().ooms, 0u);
  EXPECT_GE(pool.stats().oom_retries, 0u);
  EXPECT_NO_THROW(pool.check_invariants());
  test::deallocate_all(pool, held);
}

TEST(VirtualMemoryPool, OutOfMemoryStatesLiveMappedAndFree) {
  HostVirtualMemory memory;
  constexpr std::size_t kCap = 8 * kMiB;
  VirtualMemoryPool pool(memory, {.max_physical_bytes = kCap});
  EXPECT_EQ(pool.capacity(), kCap);
  void* held = pool.allocate(5 * kMiB);
  void* freed = pool.allocate(2 * kMiB);
  pool.free(freed);
  const Snapshot before(pool);
  try {
    (void)pool.allocate(4 * kMiB);
    ADD_FAILURE() << "allocated past the cap";
  } catch (const OutOfMemory& e) {
    const std::string message = e.what();
    EXPECT_EQ(e.info.requested, 4 * kMiB);
    EXPECT_EQ(e.info.live, 5 * kMiB);
    EXPECT_EQ(e.info.reserved, 7 * kMiB) << "physical bytes held";
    EXPECT_EQ(e.info.capacity, kCap);
    EXPECT_TRUE(Contains(message, "live 5242880 B"));
    EXPECT_TRUE(Contains(message, "mapped 7340032 B"));
    EXPECT_TRUE(Contains(message, "largest free block 2097152 B"));
    EXPECT_TRUE(Contains(message, "physical cap"));
  }
  expect_unchanged(before, pool);
  EXPECT_EQ(pool.stats().ooms, 1u);
  EXPECT_NO_THROW(pool.check_invariants());
  // What fits still works, with the freed pages moved under it.
  void* fits = pool.allocate(3 * kMiB);
  EXPECT_LE(pool.vm_stats().physical_bytes, kCap);
  pool.free(fits);
  pool.free(held);
}

TEST(VirtualMemoryPool, HugeAndMisalignedRequestsAreRejected) {
  HostVirtualMemory memory;
  VirtualMemoryPool pool(memory);
  EXPECT_THROW((void)pool.allocate(VirtualMemoryPool::kMaxAllocation + 1), OutOfMemory);
  EXPECT_THROW((void)pool.allocate(64, 48, Stream{}), InvalidArgument);
  EXPECT_EQ(pool.allocate(0), nullptr);
  void* aligned = pool.allocate(5000, 64 * kKiB, Stream{});
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(aligned) % (64 * kKiB), 0u);
  std::memset(aligned, 3, 5000);
  pool.free(aligned);
  EXPECT_NO_THROW(pool.check_invariants());
}

// Any cap is accepted (replay's --min-capacity bisects over plain byte counts); chunks
// are whole pages, so the pool holds at most the cap rounded down to pages.
TEST(VirtualMemoryPool, CapNeedNotBeAMultipleOfThePageSize) {
  HostVirtualMemory memory;
  VirtualMemoryPool pool(memory, {.max_physical_bytes = 3 * kPage + 5000});
  EXPECT_EQ(pool.capacity(), 3 * kPage + 5000);
  void* fits = pool.allocate(3 * kPage);
  EXPECT_THROW((void)pool.allocate(100), OutOfMemory) << "a fourth page would pass the cap";
  pool.free(fits);
}

TEST(VirtualMemoryPool, BadOptionsAreRejected) {
  HostVirtualMemory memory;
  EXPECT_THROW(VirtualMemoryPool(memory, {.page_size = 3 * kPage}), InvalidArgument);
  EXPECT_THROW(VirtualMemoryPool(memory, {.page_size = 1000}), InvalidArgument);
  EXPECT_THROW(VirtualMemoryPool(memory, {.range_size = 0}), InvalidArgument);
  EXPECT_THROW(VirtualMemoryPool(memory, {.growth_slack = -0.5}), InvalidArgument);
}

// ---- trim, eager unmapping, streams ---------------------------------------------------------

TEST(VirtualMemoryPool, TrimUnmapsAndDestroysFreePages) {
  HostVirtualMemory memory;
  VirtualMemoryPool pool(memory);
  void* kept = pool.allocate(kBlock);
  void* freed = pool.allocate(4 * kMiB);
  pool.free(freed);
  EXPECT_EQ(pool.trim(), 4 * kMiB);
  const VirtualMemoryPoolStats s = pool.vm_stats();
  EXPECT_EQ(s.physical_bytes, kBlock);
  EXPECT_EQ(s.mapped_bytes, kBlock);
  EXPECT_EQ(s.spare_bytes, 0u);
  EXPECT_EQ(memory.physical_bytes(), kBlock);
  EXPECT_NO_THROW(pool.check_invariants());
  pool.free(kept);
  EXPECT_EQ(pool.trim(), kBlock);
  EXPECT_EQ(memory.physical_bytes(), 0u);
  EXPECT_EQ(pool.stats().segments, 0u);
}

TEST(VirtualMemoryPool, EagerUnmapKeepsOnlyPagesInUseMapped) {
  HostVirtualMemory memory;
  VirtualMemoryPool pool(memory, {.eager_unmap = true});
  void* a = pool.allocate(4 * kMiB);
  void* b = pool.allocate(4 * kMiB);
  pool.free(a);
  EXPECT_EQ(pool.vm_stats().mapped_bytes, 4 * kMiB);
  EXPECT_EQ(pool.vm_stats().spare_bytes, 4 * kMiB) << "unmapped chunks stay as spares";
  void* c = pool.allocate(2 * kMiB);
  EXPECT_EQ(pool.vm_stats().creates, 128u) << "spares serve the next request";
  pool.free(b);
  pool.free(c);
  EXPECT_EQ(pool.vm_stats().mapped_bytes, 0u);
  EXPECT_NO_THROW(pool.check_invariants());
}

TEST(VirtualMemoryPool, DestroyingSpareChunksGivesMemoryBack) {
  HostVirtualMemory memory;
  VirtualMemoryPool pool(memory, {.eager_unmap = true, .destroy_spare_chunks = true});
  void* a = pool.allocate(4 * kMiB);
  pool.free(a);
  EXPECT_EQ(memory.physical_bytes(), 0u);
  EXPECT_EQ(pool.stats().segment_releases, 64u);
}

TEST(VirtualMemoryPool, PagesMoveBetweenStreamsOnlyWhenNeeded) {
  HostVirtualMemory memory;
  VirtualMemoryPool pool(memory);
  void* on_one = pool.allocate(4 * kMiB, Stream{1});
  pool.deallocate(on_one, 4 * kMiB, Stream{1});
  // Stream 2 has its own range; stream 1's free pages move there instead of new chunks.
  void* on_two = pool.allocate(4 * kMiB, Stream{2});
  const VirtualMemoryPoolStats s = pool.vm_stats();
  EXPECT_EQ(s.creates, 64u);
  EXPECT_EQ(s.remapped_pages, 64u);
  EXPECT_EQ(s.ranges, 2u);
  // Freed on another stream: host events complete at once.
  pool.deallocate(on_two, 4 * kMiB, Stream{1});
  EXPECT_EQ(pool.stats().live_bytes, 0u);
  EXPECT_EQ(pool.stats().streams, 2u);
  EXPECT_NO_THROW(pool.check_invariants());
}

VirtualMemoryPoolOptions with_events(StreamEvents& events) {
  VirtualMemoryPoolOptions options;
  options.stream_events = &events;
  return options;
}

TEST(VirtualMemoryPool, RecordStreamMakesTheFreeWaitForThatStream) {
  conformance::ControlledStreamEvents events;
  HostVirtualMemory memory;
  VirtualMemoryPool pool(memory, with_events(events));
  void* a = pool.allocate(kBlock, Stream{1});
  pool.record_stream(a, Stream{3});
  pool.record_stream(a, Stream{3});  // once per stream
  pool.record_stream(a, Stream{1});  // its own stream: nothing to wait for
  pool.free(a, Stream{1});
  EXPECT_EQ(events.recorded(), 1u);
  EXPECT_EQ(events.recorded_on(Stream{3}), 1u);
  EXPECT_EQ(pool.stats().pending_free_bytes, kBlock);
  // Until stream 3's work is done, a's memory is not handed out again.
  void* b = pool.allocate(kBlock, Stream{1});
  EXPECT_TRUE(static_cast<char*>(b) + kBlock <= static_cast<char*>(a) ||
              static_cast<char*>(a) + kBlock <= static_cast<char*>(b));
  events.complete_all();
  pool.free(b, Stream{1});
  EXPECT_GT(pool.trim(), 0u);  // collects the pending free, then gives the pages back
  EXPECT_EQ(pool.stats().pending_free_bytes, 0u);
  int on_stack = 0;
  EXPECT_THROW(pool.record_stream(&on_stack, Stream{3}), InvalidPointer);
  pool.record_stream(nullptr, Stream{3});  // a zero-byte allocation: nothing
  EXPECT_EQ(pool.stats().live_bytes, 0u);
  EXPECT_EQ(events.misuses(), 0u);
  EXPECT_NO_THROW(pool.check_invariants());
}

TEST(VirtualMemoryPool, RecordStreamOnALiveBlockAtDestructionLeaksNothing) {
  conformance::ControlledStreamEvents events;
  HostVirtualMemory memory;
  {
    VirtualMemoryPool pool(memory, with_events(events));
    pool.record_stream(pool.allocate(4 * kKiB, Stream{1}), Stream{2});  // left live
  }
  EXPECT_EQ(memory.physical_bytes(), 0u);  // and ASan sees no leak of the stream list
}

TEST(VirtualMemoryPool, DestructionReleasesEverything) {
  HostVirtualMemory memory;
  {
    VirtualMemoryPool pool(memory);
    (void)pool.allocate(3 * kMiB);  // left live on purpose
    pool.free(pool.allocate(100, 512, Stream{4}));
  }
  EXPECT_EQ(memory.physical_bytes(), 0u);
  EXPECT_EQ(memory.mapped_bytes(), 0u);
  EXPECT_EQ(memory.reserved_bytes(), 0u);
}

TEST(VirtualMemoryPool, ConcurrentStreamsStealWithoutCorruption) {
  HostVirtualMemory memory;
  VirtualMemoryPool pool(memory, {.max_physical_bytes = 48 * kMiB});
  constexpr int kThreads = 4;
  std::vector<std::thread> threads;
  std::vector<std::string> failures(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Holdings held;
      std::mt19937_64 rng(100 + t);
      const Stream stream{static_cast<std::uintptr_t>(t + 1)};
      for (int step = 0; step < 300; ++step) {
        if (!held.empty() && (rng() % 2 == 0 || held.all().size() > 4)) {
          void* ptr = held.all().begin()->first;
          pool.deallocate(ptr, held.remove(ptr), stream);
        } else {
          const std::size_t size = 1 + rng() % (3 * kMiB);
          try {
            held.add(pool.allocate(size, stream), size);
          } catch (const OutOfMemory&) {
            // The cap is shared; another thread may hold it for a while.
          }
        }
        if (!held.intact()) {
          failures[t] = "corruption at step " + std::to_string(step);
          return;
        }
      }
      for (const auto& [ptr, entry] : std::map(held.all())) {
        pool.deallocate(ptr, held.remove(ptr), stream);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const std::string& failure : failures) EXPECT_TRUE(failure.empty()) << failure;
  EXPECT_EQ(pool.stats().live_bytes, 0u);
  EXPECT_LE(pool.vm_stats().peak_physical_bytes, 48 * kMiB);
  if (memory.can_move()) {
    EXPECT_GT(pool.vm_stats().moves, 0u) << "pages moved (mremap) while other threads ran";
  }
  EXPECT_NO_THROW(pool.check_invariants());
}

// ---- failures injected at every step --------------------------------------------------------

struct InjectedFailure {
  Step step;
  Failure failure;
  const char* step_name;
};

std::string describe(const InjectedFailure& f, std::uint64_t nth) {
  return std::string(f.step_name) + " #" + std::to_string(nth) +
         (f.failure == Failure::kOutOfMemory ? " (out of memory)" : " (error)");
}

// For every step (reserve, create, map), every kind of failure and every position of the
// failing call within a request: the request throws a clear error or succeeds (when the
// pool could work around an out-of-memory), and in every case the pool stays consistent,
// the memory under it agrees with it, live memory keeps its bytes, and the same request
// succeeds once the failure is gone.
TEST(VirtualMemoryPool, InjectedFailuresAtEveryStepLeaveThePoolConsistent) {
  const InjectedFailure kinds[] = {
      {Step::kReserve, Failure::kOutOfMemory, "reserve"},
      {Step::kReserve, Failure::kError, "reserve"},
      {Step::kCreate, Failure::kOutOfMemory, "create"},
      {Step::kCreate, Failure::kError, "create"},
      {Step::kMap, Failure::kOutOfMemory, "map"},
      {Step::kMap, Failure::kError, "map"},
  };
  constexpr std::size_t kRequest = 2 * kMiB + 5;  // 33 pages on a new stream's new range
  for (const InjectedFailure& kind : kinds) {
    for (const std::uint64_t nth : {0u, 1u, 16u, 32u}) {
      for (const bool persistent : {false, true}) {
        SCOPED_TRACE(describe(kind, nth) + (persistent ? ", persistent" : ", once"));
        HostVirtualMemory real;
        FailingVirtualMemory memory(real);
        VirtualMemoryPool pool(memory);
        Holdings held;
        void* warm = pool.allocate(3 * kMiB);  // range and pages of stream 0
        held.add(warm, 3 * kMiB);
        const Snapshot before(pool);
        memory.fail(kind.step, kind.step == Step::kReserve ? 0 : nth, kind.failure, persistent);
        void* ptr = nullptr;
        try {
          ptr = pool.allocate(kRequest, Stream{9});
        } catch (const OutOfMemory& e) {
          EXPECT_TRUE(Contains(e.what(), "injected " + std::string(kind.step_name) + " failure"));
          EXPECT_TRUE(Contains(e.what(), "live"));
          EXPECT_EQ(e.info.requested, kRequest);
        } catch (const Error& e) {
          EXPECT_EQ(kind.failure, Failure::kError) << e.what();
          EXPECT_TRUE(Contains(e.what(), "injected " + std::string(kind.step_name) + " failure"));
          EXPECT_TRUE(
              Contains(e.what(), kind.step == Step::kReserve ? "reserving" : kind.step_name));
        }
        if (ptr == nullptr) {
          EXPECT_TRUE(memory.fired(kind.step) || kind.step == Step::kCreate)
              << "failed without the injected failure";
          expect_unchanged(before, pool);
        } else {
          EXPECT_EQ(kind.failure, Failure::kOutOfMemory) << "an Error must not be swallowed";
          held.add(ptr, kRequest);
        }
        EXPECT_NO_THROW(pool.check_invariants());
        EXPECT_EQ(real.physical_bytes(), pool.vm_stats().physical_bytes);
        EXPECT_EQ(real.mapped_bytes(), pool.vm_stats().mapped_bytes);
        EXPECT_TRUE(held.intact());
        memory.disarm();
        if (ptr == nullptr) {
          ptr = pool.allocate(kRequest, Stream{9});
          held.add(ptr, kRequest);
        }
        EXPECT_TRUE(held.intact());
        for (const auto& [p, entry] : std::map(held.all())) pool.free(p);
        EXPECT_NO_THROW(pool.check_invariants());
      }
    }
  }
}

// A map failure in the middle of a stitched request: pages already moved under it go back
// to the spares, the live block whose neighbours lost pages keeps its bytes.
TEST(VirtualMemoryPool, MapFailureDuringStitchingRollsBack) {
  HostVirtualMemory real;
  FailingVirtualMemory memory(real);
  VirtualMemoryPool pool(memory, {.max_physical_bytes = 10 * kBlock});
  Holdings held;
  allocate_ten_and_free_every_other(pool, held);
  const Snapshot before(pool);
  memory.fail(Step::kMap, 50, Failure::kError);
  EXPECT_THROW((void)pool.allocate(6 * kMiB), Error);
  expect_unchanged(before, pool);
  EXPECT_NO_THROW(pool.check_invariants());
  EXPECT_TRUE(held.intact());
  EXPECT_GT(pool.vm_stats().spare_bytes, 0u) << "moved pages wait as spares";
  void* big = pool.allocate(6 * kMiB);  // now it works, from the spares
  held.add(big, 6 * kMiB);
  EXPECT_TRUE(held.intact());
  EXPECT_LE(pool.vm_stats().physical_bytes, 10 * kBlock);
  for (const auto& [p, entry] : std::map(held.all())) pool.free(p);
}

}  // namespace
}  // namespace sdalloc
