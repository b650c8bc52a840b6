// fault_injection_test.cpp - every resource call a trace replay makes, failed one at a time.
//
// A clean replay of a bundled trace through a pool counts the calls that reach the resource
// below (support/fault_injection.hpp: allocate and deallocate of a MemoryResource; reserve,
// create, map and unmap of a VirtualMemory). Then the replay runs once per k with the k-th
// call failing. After every request that saw an injected failure (whether the pool threw or
// absorbed it):
//  - check_invariants() holds;
//  - every live allocation is still live at its address with its size, and the tag written
//    into its first and last bytes when it was allocated is intact (nothing lost or moved);
//  - an error that escaped is typed: OutOfMemory when an allocate, reserve or create failed,
//    another sdalloc::Error (not InvalidArgument / InvalidPointer) otherwise;
//  - the same request, made again, succeeds.
// Pools: CachingPool and PlannedArena (two steps: recorded, then planned) over HostResource,
// every call of the UNet trace (a seeded quarter of PlannedArena's under ThreadSanitizer);
// VirtualMemoryPool over HostVirtualMemory, whose map calls number in the tens of thousands
// on that trace, every call of a shorter real trace (the first events of the ResNet trace)
// and a seeded random sample of the UNet trace's calls.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iostream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/policies/caching_pool.hpp"
#include "sdalloc/policies/planned_arena.hpp"
#include "sdalloc/policies/virtual_memory_pool.hpp"
#include "sdalloc/resources/host_resource.hpp"
#include "sdalloc/resources/host_virtual_memory.hpp"
#include "sdalloc/trace/event_trace.hpp"
#include "support/fault_injection.hpp"
#include "support/sanitizers.hpp"

namespace sdalloc::test {
namespace {

const std::string kUnetTrace = SDALLOC_DATA_DIR "/traces/sd15_unet_b2_64x64_cpu.csv";
const std::string kResnetTrace =
    SDALLOC_DATA_DIR "/traces/torchvision_resnet50_b1_224_cpu_2pass.csv";
// The short trace for the virtual-memory pool: the ResNet trace's first events, whose
// replay makes a few hundred calls (each failed in a run of its own; 120 events make 1021).
constexpr std::size_t kShortTraceEvents = 40;

// ===================================================================== the checked replay

struct Live {
  void* ptr;
  std::size_t size;
  std::uint64_t tag;
};

// Writes the tag into the first and the last (up to) 8 bytes of the block; the whole block
// would cost a page fault per 4 KiB of gigabytes of allocations.
void write_tag(const Live& b) {
  const std::size_t n = std::min<std::size_t>(b.size, sizeof b.tag);
  std::memcpy(b.ptr, &b.tag, n);
  std::memcpy(static_cast<char*>(b.ptr) + b.size - n, &b.tag, n);
}
bool tag_intact(const Live& b) {
  const std::size_t n = std::min<std::size_t>(b.size, sizeof b.tag);
  return std::memcmp(b.ptr, &b.tag, n) == 0 &&
         std::memcmp(static_cast<const char*>(b.ptr) + b.size - n, &b.tag, n) == 0;
}

// Replays `trace` `steps` times through `pool` (inside begin_step/end_step for a
// PlannedArena), then frees what is live and trims. Every request goes through request(),
// which applies the checks above whenever the plan injected a failure during it. The first
// broken check is kept in `violation` and ends the run.
template <class P>
class CheckedReplay {
 public:
  CheckedReplay(P& pool, FaultPlan& plan) : pool_(pool), plan_(plan) {}

  // Empty on success; otherwise what broke, with the request it broke on.
  std::string run(const EventTrace& trace, int steps) {
    for (int step = 0; step < steps && violation_.empty(); ++step) {
      if constexpr (std::is_same_v<P, PlannedArena>) {
        request("begin_step", [&] { pool_.begin_step(); });
      }
      for (const TraceEvent& e : trace.events) {
        if (!violation_.empty()) break;
        replay_event(e);
      }
      if constexpr (std::is_same_v<P, PlannedArena>) {
        if (violation_.empty()) request("end_step", [&] { pool_.end_step(); });
      }
    }
    while (violation_.empty() && !live_.empty()) {
      const auto it = live_.begin();
      request("free at end", [&] {
        pool_.free(it->second.ptr);
        live_.erase(it);
      });
    }
    if (violation_.empty()) request("trim", [&] { pool_.trim(); });
    return violation_;
  }

  // Frees what a failed run left live, with injection off (before the pool is destroyed).
  void release_live() {
    for (const auto& [id, b] : live_) {
      try {
        pool_.free(b.ptr);
      } catch (const Error&) {  // a block the run lost: reported as its violation already
      }
    }
    live_.clear();
  }

 private:
  void replay_event(const TraceEvent& e) {
    const Stream stream{static_cast<std::uintptr_t>(e.stream)};
    std::ostringstream what;
    what << (e.op == TraceEvent::Op::kAlloc ? "a," : "f,") << e.id << ',' << e.size;
    if (e.op == TraceEvent::Op::kAlloc) {
      request(what.str(), [&] {
        const auto size = static_cast<std::size_t>(e.size);
        void* p = pool_.allocate(size, stream);
        if (p == nullptr) return;
        const Live b{p, size, 0x5d0a110c00000000ULL ^ (e.id * 0x9E3779B97F4A7C15ULL)};
        write_tag(b);
        live_.emplace(e.id, b);
      });
    } else {
      const auto it = live_.find(e.id);
      if (it == live_.end()) return;  // a zero-byte allocation: nothing to free
      request(what.str(), [&] {
        pool_.deallocate(it->second.ptr, it->second.size, stream);
        live_.erase(it);
      });
    }
  }

  void request(const std::string& what, const std::function<void()>& perform) {
    const std::uint64_t failures = plan_.failures();
    std::string escaped;
    try {
      perform();
    } catch (const Error& e) {
      escaped = e.what();
      if (plan_.failures() == failures)
        return fail(what, "an error with no injected failure: " + escaped);
      const ResourceCall call = plan_.last_failed();
      const bool oom = dynamic_cast<const OutOfMemory*>(&e) != nullptr;
      if (fails_as_out_of_memory(call) && !oom) {
        return fail(what, std::string("a failed ") + resource_call_name(call) +
                              " did not surface as OutOfMemory: " + escaped);
      }
      if (dynamic_cast<const InvalidArgument*>(&e) != nullptr ||
          dynamic_cast<const InvalidPointer*>(&e) != nullptr) {
        return fail(what, "an injected failure surfaced as a caller's error: " + escaped);
      }
    } catch (const std::exception& e) {
      return fail(what, std::string("an untyped error: ") + e.what());
    }
    if (plan_.failures() == failures) return;
    if (!consistent(what + (escaped.empty() ? " (absorbed)" : " (threw '" + escaped + "')")))
      return;
    if (escaped.empty()) return;  // the pool absorbed the failure and served the request
    try {
      perform();
    } catch (const std::exception& e) {
      return fail(what, "the request after the failure (" + escaped + ") failed: " + e.what());
    }
    consistent(what + " (retried)");
  }

  bool consistent(const std::string& what) {
    try {
      pool_.check_invariants();
    } catch (const std::exception& e) {
      fail(what, std::string("check_invariants: ") + e.what());
      return false;
    }
    for (const auto& [id, b] : live_) {
      std::size_t size = 0;
      try {
        size = pool_.allocation_size(b.ptr);
      } catch (const std::exception& e) {
        fail(what, "live id " + std::to_string(id) + " was lost: " + e.what());
        return false;
      }
      if (size != b.size || !tag_intact(b)) {
        fail(what, "live id " + std::to_string(id) + " was resized or overwritten");
        return false;
      }
    }
    return true;
  }

  void fail(const std::string& what, const std::string& why) {
    if (violation_.empty()) violation_ = "at request '" + what + "': " + why;
  }

  P& pool_;
  FaultPlan& plan_;
  std::unordered_map<std::uint64_t, Live> live_;
  std::string violation_;
};

// ===================================================================== one run per k

// A pool over its resources, built afresh for every run: make(plan) returns an object with
// pool() and a destructor that frees the resources.
struct CachingStack {
  explicit CachingStack(FaultPlan& plan) : faulty(host, plan), pool(faulty) {}
  HostResource host;
  FaultInjectingResource faulty;
  CachingPool pool;
};
struct PlannedStack {
  // A short planning budget: the test plans once per run, hundreds of runs.
  explicit PlannedStack(FaultPlan& plan)
      : faulty(host, plan), pool(faulty, {.planner_time_limit_seconds = 0.01}) {}
  HostResource host;
  FaultInjectingResource faulty;
  PlannedArena pool;
};
struct VirtualStack {
  // 1 GiB ranges, not 64 GiB: reserving them is most of a short run's cost under ASan.
  explicit VirtualStack(FaultPlan& plan)
      : faulty(memory, plan), pool(faulty, {.range_size = std::size_t{1} << 30}) {}
  HostVirtualMemory memory;
  FaultInjectingVirtualMemory faulty;
  VirtualMemoryPool pool;
};

using Kinds = std::vector<ResourceCall>;
const Kinds kEveryCall = {ResourceCall::kAllocate, ResourceCall::kDeallocate,
                          ResourceCall::kReserve,  ResourceCall::kCreate,
                          ResourceCall::kMap,      ResourceCall::kUnmap,
                          ResourceCall::kMove};

// Runs the replay with the k-th call of `kinds` failing (nullopt: none); returns the
// violation, empty when every check held. `calls` gets the number of calls the run counted.
template <class Stack>
std::string run_once(const EventTrace& trace, int steps, const Kinds& kinds,
                     std::optional<std::uint64_t> k, std::uint64_t* calls = nullptr) {
  FaultPlan plan;
  plan.count_only(kinds);
  Stack stack(plan);
  if (k) plan.fail_call(*k);
  CheckedReplay replay(stack.pool, plan);
  std::string violation = replay.run(trace, steps);
  plan.disarm();
  if (calls != nullptr) *calls = plan.calls();
  // A k past this run's last call has nothing to fail: how many calls a replay makes can
  // depend on time (a planned step whose planning meets its deadline under a sanitizer takes
  // another path), so such a run is not a violation, only a run that tested nothing.
  if (violation.empty() && k && plan.failures() > 1) {
    violation = "call " + std::to_string(*k) + " failed more than once";
  }
  replay.release_live();
  return violation;
}

// Fails each call in `ks` in its own run; reports every k whose run broke a check.
template <class Stack>
void fail_each(const EventTrace& trace, int steps, const Kinds& kinds,
               const std::vector<std::uint64_t>& ks) {
  int broken = 0;
  for (const std::uint64_t k : ks) {
    const std::string violation = run_once<Stack>(trace, steps, kinds, k);
    if (!violation.empty() && ++broken <= 5) {
      ADD_FAILURE() << "failing call " << k << ": " << violation;
    }
  }
  EXPECT_EQ(broken, 0) << "of " << ks.size() << " runs";
}

std::vector<std::uint64_t> every_call(std::uint64_t calls) {
  std::vector<std::uint64_t> ks(calls);
  for (std::uint64_t k = 0; k < calls; ++k) ks[k] = k;
  return ks;
}

// The first and last calls and a fixed-seed random quarter of the others: random, not every
// fourth, so that no kind of call that recurs with a period is skipped whole.
[[maybe_unused]] std::vector<std::uint64_t> a_quarter_of_the_calls(std::uint64_t calls) {
  std::vector<std::uint64_t> ks;
  std::mt19937_64 random(37);
  for (std::uint64_t k = 0; k < calls; ++k) {
    if (k == 0 || k + 1 == calls || random() % 4 == 0) ks.push_back(k);
  }
  return ks;
}

// The calls of `kinds` a clean run makes (printed: the test's size is its number of runs).
template <class Stack>
std::uint64_t clean_calls(const EventTrace& trace, int steps, const Kinds& kinds) {
  std::uint64_t calls = 0;
  EXPECT_EQ(run_once<Stack>(trace, steps, kinds, std::nullopt, &calls), "");
  std::cout << "clean replay: " << calls << " resource calls\n";
  ::testing::Test::RecordProperty("calls", std::to_string(calls));
  return calls;
}

EventTrace prefix(const EventTrace& trace, std::size_t events) {
  EventTrace cut = trace;
  cut.events.resize(std::min(events, cut.events.size()));
  return cut;
}

// ===================================================================== the tests

// Deallocate included: a failed deallocate while CachingPool::free consolidated made free()
// throw for a free that happened (finding FA1) and leaked segment records (FA3); one while a
// recording step gave its cache back broke PlannedArena's books (FA2). Now the range is left
// to the resource, counted in failed_releases, and the request goes on.
TEST(FaultInjection, CachingPoolSurvivesEachFailedCallOfTheUnetReplay) {
  const EventTrace trace = read_event_trace(kUnetTrace);
  const std::uint64_t calls = clean_calls<CachingStack>(trace, 1, kEveryCall);
  ASSERT_GT(calls, 0u);
  fail_each<CachingStack>(trace, 1, kEveryCall, every_call(calls));
}

TEST(FaultInjection, PlannedArenaSurvivesEachFailedCallOfTwoUnetSteps) {
  const EventTrace trace = read_event_trace(kUnetTrace);
  const std::uint64_t calls = clean_calls<PlannedStack>(trace, 2, kEveryCall);
  ASSERT_GT(calls, 0u);
  // ThreadSanitizer looks for races, not for the bookkeeping of a failure, which the release
  // and ASan builds check on every call; under it the 892 runs took 124 s alone on a quiet
  // 2-core VM (2026-12-06) and passed ctest's 600 s limit in a loaded run (2026-12-05), so
  // it fails a quarter.
  if (test::kThreadSanitizer) {
    fail_each<PlannedStack>(trace, 2, kEveryCall, a_quarter_of_the_calls(calls));
  } else {
    fail_each<PlannedStack>(trace, 2, kEveryCall, every_call(calls));
  }
}

TEST(FaultInjection, VirtualMemoryPoolSurvivesEachFailedCallOfAShortTrace) {
  const EventTrace trace = prefix(read_event_trace(kResnetTrace), kShortTraceEvents);
  const std::uint64_t calls = clean_calls<VirtualStack>(trace, 1, kEveryCall);
  ASSERT_GT(calls, 0u);
  fail_each<VirtualStack>(trace, 1, kEveryCall, every_call(calls));
}

TEST(FaultInjection, VirtualMemoryPoolSurvivesASampleOfFailedCallsOfTheUnetReplay) {
  const EventTrace trace = read_event_trace(kUnetTrace);
  const std::uint64_t calls = clean_calls<VirtualStack>(trace, 1, kEveryCall);
  ASSERT_GT(calls, 1000u) << "the UNet replay should make tens of thousands of calls";
  // The first and last calls, and a fixed-seed sample between them.
  std::vector<std::uint64_t> ks = {0, 1, calls - 1};
  std::mt19937_64 random(15);
  for (int i = 0; i < 7; ++i) ks.push_back(random() % calls);
  fail_each<VirtualStack>(trace, 1, kEveryCall, ks);
}

TEST(FaultInjection, TheAdaptorFailsExactlyTheArmedCallWithItsType) {
  FaultPlan plan;
  HostResource host;
  FaultInjectingResource faulty(host, plan);
  plan.fail_call(1);
  void* a = faulty.allocate(4096);
  EXPECT_THROW(faulty.allocate(4096), OutOfMemory);
  void* b = faulty.allocate(4096);
  plan.fail_call(0);
  try {
    faulty.deallocate(a, 4096);
    ADD_FAILURE() << "deallocate did not fail";
  } catch (const OutOfMemory&) {
    ADD_FAILURE() << "a failed deallocate is not a lack of memory";
  } catch (const Error&) {
  }
  faulty.deallocate(a, 4096);
  faulty.deallocate(b, 4096);
  EXPECT_EQ(plan.calls(), 6u);
  EXPECT_EQ(plan.failures(), 2u);
  EXPECT_EQ(plan.last_failed(), ResourceCall::kDeallocate);

  HostVirtualMemory memory;
  FaultInjectingVirtualMemory vm(memory, plan);
  plan.fail_call(0);
  EXPECT_THROW(vm.create(memory.granularity()), OutOfMemory);
  const PhysicalChunk chunk = vm.create(memory.granularity());
  void* base = vm.reserve(memory.granularity(), 0);
  plan.fail_call(0);
  EXPECT_THROW(vm.map(base, chunk), Error);
  EXPECT_EQ(memory.mapped_bytes(), 0u) << "a failed call does nothing below";
  vm.map(base, chunk);
  vm.unmap(base, chunk.bytes, kDefaultStream);
  vm.destroy(chunk);
  vm.release(base, memory.granularity());
}

}  // namespace
}  // namespace sdalloc::test
