// ort_allocator_threads_test.cpp - the OrtAllocator adapter called from several threads at
// once, as ORT's intra-op thread pool calls it: Alloc, Reserve, Free, foreign Frees and
// GetStats interleaved. No session runs here, so this suite is also the adapter's test under
// ThreadSanitizer, where ORT's own (uninstrumented) thread pool would read as races and the
// session tests are left out (tests/onnxruntime/CMakeLists.txt).
#include <gtest/gtest.h>

#include <onnxruntime_c_api.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "onnxruntime/ort_env.hpp"
#include "sdalloc/onnxruntime/ort_allocator.hpp"

namespace sdalloc::onnxruntime {
namespace {

using test::host;

constexpr int kThreads = 4;
constexpr int kRounds = 400;

// Each thread keeps a few allocations alive at once, filled with its own byte, and checks the
// byte before it frees them: two threads handed overlapping memory would see each other's.
void churn(OrtAllocator* a, int id, std::atomic<int>& damaged) {
  const auto mark = static_cast<unsigned char>(0x40 + id);
  struct Held {
    unsigned char* p;
    std::size_t size;
  };
  std::vector<Held> held;
  std::uint32_t seed = 12345u + static_cast<std::uint32_t>(id);
  for (int round = 0; round < kRounds; ++round) {
    seed = seed * 1664525u + 1013904223u;
    const std::size_t size = 256 + (seed >> 8) % (96 * 1024);
    void* p = (round % 7 == 0) ? a->Reserve(a, size) : a->Alloc(a, size);
    if (p == nullptr) {
      damaged.fetch_add(1);
      continue;
    }
    std::memset(p, mark, size);
    held.push_back({static_cast<unsigned char*>(p), size});
    if (held.size() > 6 || round == kRounds - 1) {
      for (const Held& h : held) {
        if (h.p[0] != mark || h.p[h.size / 2] != mark || h.p[h.size - 1] != mark) {
          damaged.fetch_add(1);
        }
        a->Free(a, h.p);
      }
      held.clear();
    }
    if (round % 10 == 0) {
      int not_ours = 0;
      a->Free(a, &not_ours);  // refused and counted, never fatal
    }
  }
}

TEST(OrtAllocatorThreads, ConcurrentCallsKeepCountsAndMemoryApart) {
  OrtPoolAllocator allocator(std::make_shared<PoolOf<CachingPool>>(host()));
  OrtAllocator* a = allocator.get();
  std::atomic<int> damaged{0};
  std::atomic<bool> done{false};
  std::atomic<int> stats_calls{0};
  std::atomic<int> attempts{0};
  // ORT asks for stats while runs allocate (a profiler, a log line): read them throughout.
  std::thread reader([&] {
    const OrtApi& api = ort_api();
    while (!done.load()) {
      OrtKeyValuePairs* kvps = nullptr;
      if (api.AllocatorGetStats(a, &kvps) == nullptr && kvps != nullptr) {
        if (api.GetKeyValue(kvps, "NumAllocs") == nullptr) damaged.fetch_add(1);
        api.ReleaseKeyValuePairs(kvps);
        stats_calls.fetch_add(1);
      }
      attempts.fetch_add(1);
      std::this_thread::yield();
    }
  });
  // The workers start once the reader has tried a read: on a loaded machine they could
  // otherwise finish before it is first scheduled, and nothing would be read while they ran.
  while (attempts.load() == 0) std::this_thread::yield();
  std::vector<std::thread> workers;
  workers.reserve(kThreads);
  for (int id = 0; id < kThreads; ++id) workers.emplace_back(churn, a, id, std::ref(damaged));
  for (std::thread& t : workers) t.join();
  done.store(true);
  reader.join();

  EXPECT_EQ(damaged.load(), 0);
  EXPECT_GT(stats_calls.load(), 0);
  const OrtPoolAllocatorCounters c = allocator.counters();
  const std::uint64_t reserves_per_thread = (kRounds + 6) / 7;  // rounds 0, 7, 14, ...
  EXPECT_EQ(c.reserves, kThreads * reserves_per_thread);
  EXPECT_EQ(c.allocs, kThreads * (kRounds - reserves_per_thread));
  EXPECT_EQ(c.frees, static_cast<std::uint64_t>(kThreads) * kRounds);
  EXPECT_EQ(c.foreign_frees, kThreads * static_cast<std::uint64_t>((kRounds + 9) / 10));
  EXPECT_EQ(c.failed_allocs, 0u);
  EXPECT_EQ(c.outstanding, 0u);
  EXPECT_EQ(allocator.stats().live_bytes, 0u);
  allocator.pool().check_invariants();
}

}  // namespace
}  // namespace sdalloc::onnxruntime
