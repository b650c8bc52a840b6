// pools_fuzzer.cpp - libFuzzer target: every pool over a capped resource that fails at
// random, with check_invariants() after every operation.
//
// The input picks a pool - CachingPool or PlannedArena over HeapResource, VirtualMemoryPool
// over HeapVirtualMemory (heap_resources.hpp: no system calls, the contract checked; it
// moves mappings or not, as a bit of the failure seed says), or PlannedArena over pages of
// such a VirtualMemoryPool (another bit of the seed), each
// through a fault-injecting adaptor (support/fault_injection.hpp) that fails each call with
// a chance the input sets - small options, and up to 96 operations: allocate (aligned,
// several streams), free, deallocate with the wrong size, record_stream, trim, begin and
// end a step, reset_peak, and a change of the failure rate. After every operation:
//  - check_invariants() holds;
//  - an error is typed: OutOfMemory or Error from an allocation (an injected failure or
//    the cap), InvalidArgument for a wrong size, nothing from free;
//  - the pool's live bytes equal the shadow's;
//  - a new block overlaps no live one;
//  - every live allocation keeps its address, size (allocation_size) and tag bytes, and,
//    for the virtual-memory pool, lies on mapped pages (checked every 8th operation and at
//    the end: the tags stay, so damage done in between is still seen).
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>

#include "fuzz/heap_resources.hpp"
#include "sdalloc/core/errors.hpp"
#include "sdalloc/policies/any_pool.hpp"
#include "sdalloc/policies/caching_pool.hpp"
#include "sdalloc/policies/planned_arena.hpp"
#include "sdalloc/policies/virtual_memory_pool.hpp"
#include "support/fault_injection.hpp"

namespace {

using namespace sdalloc;

[[noreturn]] void broken(const char* what, const char* detail = "") {
  std::fprintf(stderr, "pools_fuzzer: %s %s\n", what, detail);
  std::abort();
}
void require(bool ok, const char* what) {
  if (!ok) broken(what);
}

struct Block {
  std::size_t size;
  std::uint8_t tag;
  Stream stream;
};

Stream stream_of(std::uint8_t n) { return Stream{static_cast<std::uintptr_t>(n % 3) * 0x100}; }

// One pool of any kind, seen through the operations the fuzzer makes.
template <class P>
struct Harness {
  Harness(P& p, fuzz::HeapVirtualMemory* memory, test::FaultPlan& plan)
      : pool(p), vm(memory), faults(plan) {}

  P& pool;
  fuzz::HeapVirtualMemory* vm;  // the virtual-memory pool's, to check mapped pages
  test::FaultPlan& faults;
  std::map<std::uintptr_t, Block> live;
  std::size_t live_bytes = 0;
  std::uint32_t tags = 0;
  int unswept = 0;  // operations since live blocks were last checked
  bool in_step = false;

  // After every operation the pool's own invariants and live bytes; every 8th operation, and
  // at the end, every live block as well (its tag bytes stay until a check sees them, so a
  // block an operation damaged is still found), since a sweep after each operation makes
  // an input's cost grow with the square of its live blocks.
  void check(bool every_block = false) {
    try {
      pool.check_invariants();
    } catch (const Error& e) {
      broken("check_invariants:", e.what());
    }
    require(pool.stats().live_bytes == live_bytes, "live bytes differ from the shadow's");
    if (!every_block && ++unswept < 8) return;
    unswept = 0;
    for (const auto& [a, b] : live) {
      const auto* p = reinterpret_cast<const std::uint8_t*>(a);
      // Mapped pages first: unmapped ones are poisoned (heap_resources.hpp).
      if (vm != nullptr) require(vm->is_mapped(p, b.size), "a live block on unmapped pages");
      for (std::size_t i = 0; i < (b.size < 32 ? b.size : 32); ++i) {
        require(p[i] == b.tag, "a live block's bytes changed");
      }
      require(pool.allocation_size(p) == b.size, "a live block's size changed");
    }
  }

  void allocate(std::size_t bytes, std::size_t alignment, Stream stream) {
    void* p = nullptr;
    try {
      p = pool.allocate(bytes, alignment, stream);
    } catch (const OutOfMemory&) {
      return;
    } catch (const InvalidArgument& e) {
      broken("allocate refused a valid request:", e.what());
    } catch (const InvalidPointer& e) {
      broken("allocate threw InvalidPointer:", e.what());
    } catch (const Error& e) {
      require(faults.failures() > 0, "allocate failed with no failure injected");
      return;
    }
    if (bytes == 0) return require(p == nullptr, "allocate(0) returned a pointer");
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    require(a % alignment == 0 && a % 256 == 0, "misaligned pointer");
    auto next = live.lower_bound(a);
    require(next == live.end() || next->first >= a + bytes, "a new block overlaps a live one");
    if (next != live.begin()) {
      require(std::prev(next)->first + std::prev(next)->second.size <= a, "blocks overlap");
    }
    const auto tag = static_cast<std::uint8_t>(++tags);
    std::memset(p, tag, bytes < 32 ? bytes : 32);
    live.emplace(a, Block{bytes, tag, stream});
    live_bytes += bytes;
  }

  void free(std::size_t index, bool own_stream, Stream other, bool sized) {
    if (live.empty()) return;
    const auto it = std::next(live.begin(), static_cast<long>(index % live.size()));
    void* p = reinterpret_cast<void*>(it->first);
    const Stream stream = own_stream ? it->second.stream : other;
    try {
      if (sized) {
        pool.deallocate(p, it->second.size, stream);
      } else {
        pool.free(p, stream);
      }
    } catch (const InvalidArgument& e) {
      broken("free of a live block refused:", e.what());
    } catch (const InvalidPointer& e) {
      broken("free of a live block refused:", e.what());
    } catch (const Error& e) {
      // An injected failure (an unmap of the virtual-memory pool's eager_unmap): the free
      // must then have changed nothing, the block still live.
      require(faults.failures() > 0, "free failed with no failure injected");
      try {
        (void)pool.allocation_size(p);
      } catch (const InvalidPointer&) {
        broken("free threw, yet freed the block:", e.what());
      }
      return;
    }
    live_bytes -= it->second.size;
    live.erase(it);
  }

  void wrong_size(std::size_t index) {
    if (live.empty()) return;
    const auto it = std::next(live.begin(), static_cast<long>(index % live.size()));
    try {
      pool.deallocate(reinterpret_cast<void*>(it->first), it->second.size + 512, it->second.stream);
      broken("a deallocate with the wrong size was accepted");
    } catch (const InvalidArgument&) {
    }
  }

  void record(std::size_t index, Stream stream) {
    if (live.empty()) return;
    const auto it = std::next(live.begin(), static_cast<long>(index % live.size()));
    pool.record_stream(reinterpret_cast<void*>(it->first), stream);
  }

  void trim() {
    try {
      pool.trim();
    } catch (const OutOfMemory&) {
    } catch (const InvalidArgument& e) {
      broken("trim threw InvalidArgument:", e.what());
    } catch (const Error&) {
      require(faults.failures() > 0, "trim failed with no failure injected");
    }
  }

  void step() {
    if constexpr (std::is_same_v<P, PlannedArena>) {
      if (in_step) {
        pool.end_step();
      } else {
        pool.begin_step();
      }
      in_step = !in_step;
    }
  }

  void run(FuzzedDataProvider& in) {
    for (int op = 0; op < 96 && in.remaining_bytes() > 0; ++op) {
      switch (in.ConsumeIntegralInRange<int>(0, 9)) {
        case 0:
        case 1:
        case 2: {
          const int shift = in.ConsumeIntegralInRange<int>(0, 18);
          const std::size_t bytes =
              in.ConsumeIntegralInRange<std::size_t>(0, std::size_t{1} << shift);
          const std::size_t alignment = std::size_t{1} << in.ConsumeIntegralInRange<int>(0, 14);
          allocate(bytes, alignment, stream_of(in.ConsumeIntegral<std::uint8_t>()));
          break;
        }
        case 3:
        case 4:
          free(in.ConsumeIntegral<std::uint16_t>(), in.ConsumeBool(),
               stream_of(in.ConsumeIntegral<std::uint8_t>()), in.ConsumeBool());
          break;
        case 5:
          wrong_size(in.ConsumeIntegral<std::uint16_t>());
          break;
        case 6:
          record(in.ConsumeIntegral<std::uint16_t>(),
                 stream_of(in.ConsumeIntegral<std::uint8_t>()));
          break;
        case 7:
          trim();
          break;
        case 8:
          step();
          break;
        default: {
          const std::uint32_t rate = in.ConsumeIntegralInRange<std::uint32_t>(0, 16384);
          if (in.ConsumeBool()) pool.reset_peak();
          faults.fail_randomly(rate, in.ConsumeIntegral<std::uint64_t>());
          break;
        }
      }
      check();
    }
    check(true);
    // Nothing fails while the pool is emptied and destroyed: destructors cannot report.
    faults.disarm();
    if (in_step) step();
    while (!live.empty()) free(0, true, kDefaultStream, false);
    check(true);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  const int kind = in.ConsumeIntegralInRange<int>(0, 2);
  const std::size_t cap = std::size_t{64} << 10 << in.ConsumeIntegralInRange<int>(0, 6);
  test::FaultPlan faults;
  const auto failure_rate = in.ConsumeIntegralInRange<std::uint32_t>(0, 8192);
  const auto failure_seed = in.ConsumeIntegral<std::uint64_t>();
  faults.fail_randomly(failure_rate, failure_seed);
  if (kind == 2) {
    // Whether the memory moves mappings (the pool then moves free pages in runs, and
    // failed moves are injected too) comes from a bit of the seed, not from a byte of its
    // own: the corpus keeps the meaning it had before memory could move. So does the
    // growth slack below.
    fuzz::HeapVirtualMemory memory(cap, /*moves=*/((failure_seed >> 7) & 1) != 0);
    test::FaultInjectingVirtualMemory faulty(memory, faults);
    // Every call may fail, unmap and destroy included: a free must succeed whatever the
    // memory answers (finding FV1, now corpus/pools/pools-vmm-eager-unmap-free-throws).
    VirtualMemoryPoolOptions options;
    options.page_size = std::size_t{4096} << in.ConsumeIntegralInRange<int>(0, 4);
    // Two values the pool's retired class of small requests took: still consumed, so that
    // the corpus keeps the meaning it had.
    static_cast<void>(in.ConsumeIntegralInRange<int>(0, 2));
    static_cast<void>(in.ConsumeIntegralInRange<int>(10, 16));
    options.range_size = std::size_t{1} << 20;
    options.remap_before_growth = in.ConsumeBool();
    options.eager_unmap = in.ConsumeBool();
    options.destroy_spare_chunks = in.ConsumeBool();
    if (in.ConsumeBool()) options.max_physical_bytes = cap / 2;
    // No slack (free pages move whenever there are any: the move paths run often), also
    // from a bit of the seed.
    if (((failure_seed >> 8) & 1) != 0) options.growth_slack = 0.0;
    try {
      VirtualMemoryPool pool(faulty, options);
      Harness<VirtualMemoryPool>(pool, &memory, faults).run(in);
    } catch (const InvalidArgument&) {  // options the pool refuses
    }
    return 0;
  }
  fuzz::HeapResource heap(cap);
  test::FaultInjectingResource faulty(heap, faults);
  // Deallocate fails too: a free must succeed and the books hold whatever the resource
  // answers (findings FA1-FA3, now corpus/pools/pools-leak-failed-deallocate).
  CachingPoolOptions options;
  options.segment_granularity = std::size_t{4096} << in.ConsumeIntegralInRange<int>(0, 3);
  options.min_segment_size =
      options.segment_granularity * in.ConsumeIntegralInRange<std::size_t>(1, 4);
  options.huge_threshold =
      options.segment_granularity * in.ConsumeIntegralInRange<std::size_t>(1, 16);
  options.release_cached_before_growth = in.ConsumeBool();
  options.consolidate_when_empty = in.ConsumeBool();
  if (kind == 0) {
    faults.disarm();  // the constructor's reservation, if any, must succeed
    CachingPool pool(faulty, options);
    faults.fail_randomly(in.ConsumeIntegralInRange<std::uint32_t>(0, 8192),
                         in.ConsumeIntegral<std::uint64_t>());
    Harness<CachingPool>(pool, nullptr, faults).run(in);
    return 0;
  }
  PlannedArenaOptions planned;
  planned.fallback = options;
  planned.max_plans = in.ConsumeIntegralInRange<std::size_t>(1, 3);
  planned.record_through_upstream = in.ConsumeBool();
  // A node limit, not a tight clock, ends each plan's search: the same run every time. 8,
  // not 512: the search is the planner fuzzer's, and here it took 40 % of the time
  // (replaying a grown corpus of 3,616 inputs: 8.2 CPU s with 512, 5.1 with 64; 30,000
  // runs from it: 38-40 s with 8, 42-49 s with 64).
  planned.planner_time_limit_seconds = 10.0;
  planned.planner_max_search_nodes = 8;
  if (((failure_seed >> 9) & 1) != 0) {
    // Over pages, as make_pool builds it where memory is virtual (arena_from_fallback): the
    // fallback is a VirtualMemoryPool over failing virtual memory, each arena one of its
    // allocations, pages moving between the recording and the arena. From a bit of the seed,
    // so the corpus keeps its meaning.
    fuzz::HeapVirtualMemory memory(cap, /*moves=*/((failure_seed >> 7) & 1) != 0);
    test::FaultInjectingVirtualMemory faulty_memory(memory, faults);
    VirtualMemoryPoolOptions pages;
    pages.page_size = std::size_t{4096} << (failure_seed >> 10 & 3);
    pages.range_size = std::size_t{1} << 20;
    pages.growth_slack = 0.0;
    planned.arena_from_fallback = true;
    try {
      PlannedArena pool(faulty, planned,
                        [&faulty_memory, pages](MemoryResource&, const CachingPoolOptions&) {
                          return std::make_unique<PoolOf<VirtualMemoryPool>>(faulty_memory, pages);
                        });
      Harness<PlannedArena>(pool, &memory, faults).run(in);
    } catch (const InvalidArgument&) {  // options the pools refuse
    }
    return 0;
  }
  PlannedArena pool(faulty, planned);
  Harness<PlannedArena>(pool, nullptr, faults).run(in);
  return 0;
}
