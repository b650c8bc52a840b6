// Behaviour specific to each resource and adaptor, the error helpers and the pool-statistics
// views. The generic resource contract (zero bytes, alignment, threads, streams) is checked
// for every resource by the conformance suite in tests/conformance/.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/core/pool_stats.hpp"
#include "sdalloc/core/stream_events.hpp"
#include "sdalloc/resources/host_resource.hpp"
#include "sdalloc/resources/limit_resource.hpp"
#include "sdalloc/resources/stats_resource.hpp"
#include "sdalloc/resources/trace_resource.hpp"
#include "sdalloc/trace/event_trace.hpp"
#include "support/mapped_pages.hpp"
#include "support/test_support.hpp"

namespace sdalloc {
namespace {

using test::Contains;
using test::is_unmapped;
using test::TempDir;

constexpr std::size_t kKiB = std::size_t{1} << 10;
constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kGiB = std::size_t{1} << 30;

std::uintptr_t address(const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr); }

// An upstream that refuses every request, to see what an adaptor does when its upstream
// throws.
class RefusingResource final : public MemoryResource {
 public:
  std::string name() const override { return "refusing"; }
  int calls = 0;

 private:
  void* do_allocate(std::size_t bytes, Stream) override {
    ++calls;
    OutOfMemoryInfo info;
    info.requested = bytes;
    throw OutOfMemory::describe(name(), info);
  }
  void do_deallocate(void*, std::size_t, Stream) override {}
};

// ---------------------------------------------------------------------------------------
// HostResource

TEST(HostResourceTest, ResultsArePageAligned) {
  HostResource host;
  for (const std::size_t bytes : {std::size_t{1}, std::size_t{100}, 4 * kKiB + 1, kMiB + 3}) {
    void* ptr = host.allocate(bytes);
    ASSERT_NE(ptr, nullptr);
    EXPECT_EQ(address(ptr) % HostResource::kPageSize, 0u) << bytes << " bytes";
    host.deallocate(ptr, bytes);
  }
}

TEST(HostResourceTest, HugePageResultsAreTwoMiBAligned) {
  HostResource host(HostResourceOptions{.transparent_huge_pages = true});
  std::vector<std::pair<void*, std::size_t>> held;
  // Several live at once, so they cannot all land on a 2 MiB boundary by chance.
  for (const std::size_t bytes : {std::size_t{4096}, 3 * kMiB + 5, std::size_t{100}, 2 * kMiB}) {
    void* ptr = host.allocate(bytes);
    ASSERT_NE(ptr, nullptr);
    EXPECT_EQ(address(ptr) % HostResource::kHugePageSize, 0u) << bytes << " bytes";
    held.emplace_back(ptr, bytes);
  }
  for (const auto& [ptr, bytes] : held) host.deallocate(ptr, bytes);
}

TEST(HostResourceTest, MemoryIsWritableEndToEnd) {
  for (const bool huge : {false, true}) {
    HostResource host(HostResourceOptions{.transparent_huge_pages = huge});
    const std::size_t bytes = 3 * kMiB + 17;  // not a multiple of any page size
    auto* data = static_cast<unsigned char*>(host.allocate(bytes));
    ASSERT_NE(data, nullptr);
    EXPECT_EQ(data[0], 0) << "anonymous memory starts zeroed";
    std::memset(data, 0xab, bytes);
    EXPECT_EQ(data[0], 0xab);
    EXPECT_EQ(data[bytes / 2], 0xab);
    EXPECT_EQ(data[bytes - 1], 0xab);
    host.deallocate(data, bytes);
  }
}

TEST(HostResourceTest, PopulatedMemoryIsUsable) {
  for (const bool huge : {false, true}) {
    HostResource host(HostResourceOptions{.transparent_huge_pages = huge, .populate = true});
    const std::size_t bytes = 4 * kMiB;
    auto* data = static_cast<unsigned char*>(host.allocate(bytes));
    ASSERT_NE(data, nullptr);
    EXPECT_EQ(data[bytes - 1], 0);
    data[bytes - 1] = 7;
    EXPECT_EQ(data[bytes - 1], 7);
    host.deallocate(data, bytes);
  }
}

TEST(HostResourceTest, ZeroBytesGiveNullAndNullFreeIsANoOp) {
  HostResource host;
  EXPECT_EQ(host.allocate(0), nullptr);
  host.deallocate(nullptr, 0);
  host.deallocate(nullptr, 4096);
}

TEST(HostResourceTest, DeallocateReturnsTheWholeRangeToTheSystem) {
  for (const bool huge : {false, true}) {
    HostResource host(HostResourceOptions{.transparent_huge_pages = huge});
    const std::size_t bytes = 5 * kMiB + 1;  // the last page is only partly requested
    void* ptr = host.allocate(bytes);
    ASSERT_FALSE(is_unmapped(ptr, bytes));
    host.deallocate(ptr, bytes);
    EXPECT_TRUE(is_unmapped(ptr, bytes)) << (huge ? "host(thp)" : "host");
  }
}

TEST(HostResourceTest, ImpossibleRequestThrowsOutOfMemoryWithErrnoText) {
  HostResource host;
  const std::size_t bytes = std::size_t{1} << 62;  // more than any address space
  try {
    host.allocate(bytes);
    FAIL() << "a 4 EiB mapping succeeded";
  } catch (const OutOfMemory& error) {
    EXPECT_EQ(error.info.requested, bytes);
    EXPECT_TRUE(Contains(error.what(), "host could not allocate " + format_bytes(bytes)));
    EXPECT_TRUE(Contains(error.what(), std::strerror(ENOMEM)));
  }
  EXPECT_THROW(host.allocate(std::numeric_limits<std::size_t>::max()), OutOfMemory);
}

TEST(HostResourceTest, NameSaysWhetherHugePagesAreUsed) {
  EXPECT_EQ(HostResource().name(), "host");
  EXPECT_EQ(HostResource(HostResourceOptions{.transparent_huge_pages = true}).name(), "host(thp)");
  EXPECT_EQ(HostResource().capacity(), 0u);
}

// ---------------------------------------------------------------------------------------
// LimitResource

TEST(LimitResourceTest, RefusesPastTheCapWithOutOfMemoryNamingCapacityAndUse) {
  HostResource host;
  LimitResource limit(host, kMiB);
  void* first = limit.allocate(768 * kKiB);
  EXPECT_EQ(limit.used(), 768 * kKiB);
  EXPECT_EQ(limit.available(), 256 * kKiB);
  try {
    limit.allocate(512 * kKiB);
    FAIL() << "allocation past the cap succeeded";
  } catch (const OutOfMemory& error) {
    EXPECT_EQ(error.info.requested, 512 * kKiB);
    EXPECT_EQ(error.info.capacity, kMiB);
    EXPECT_TRUE(Contains(error.what(), "capacity " + format_bytes(kMiB)));
    EXPECT_TRUE(Contains(error.what(), format_bytes(768 * kKiB) + " of the capacity in use"));
    EXPECT_TRUE(Contains(error.what(), "limit(host, 1.0 MiB) could not allocate"));
  }
  EXPECT_EQ(limit.used(), 768 * kKiB) << "a refused request reserves nothing";
  limit.deallocate(first, 768 * kKiB);
}

TEST(LimitResourceTest, ExactlyTheCapacityFitsAndOneMoreByteDoesNot) {
  HostResource host;
  LimitResource limit(host, 64 * kKiB);
  void* all = limit.allocate(64 * kKiB);
  EXPECT_EQ(limit.available(), 0u);
  EXPECT_THROW(limit.allocate(1), OutOfMemory);
  limit.deallocate(all, 64 * kKiB);
  void* again = limit.allocate(64 * kKiB);
  limit.deallocate(again, 64 * kKiB);
}

TEST(LimitResourceTest, RefusalDoesNotTouchTheUpstream) {
  HostResource host;
  StatsResource below(host);
  LimitResource limit(below, 8 * kKiB);
  EXPECT_THROW(limit.allocate(16 * kKiB), OutOfMemory);
  EXPECT_EQ(below.stats().allocations, 0u);
  EXPECT_EQ(below.stats().failures, 0u);
}

TEST(LimitResourceTest, UsedReturnsToZeroAfterFrees) {
  HostResource host;
  LimitResource limit(host, kGiB);
  std::vector<std::pair<void*, std::size_t>> held;
  for (std::size_t i = 1; i <= 8; ++i) held.emplace_back(limit.allocate(i * 1000), i * 1000);
  EXPECT_EQ(limit.used(), 36000u);
  for (const auto& [ptr, bytes] : held) limit.deallocate(ptr, bytes);
  EXPECT_EQ(limit.used(), 0u);
  EXPECT_EQ(limit.allocate(0), nullptr);
  limit.deallocate(nullptr, 0);
  EXPECT_EQ(limit.used(), 0u);
}

TEST(LimitResourceTest, UpstreamFailureUndoesTheReservation) {
  RefusingResource refusing;
  LimitResource limit(refusing, kMiB);
  EXPECT_THROW(limit.allocate(4 * kKiB), OutOfMemory);
  EXPECT_EQ(refusing.calls, 1);
  EXPECT_EQ(limit.used(), 0u);
  EXPECT_EQ(limit.available(), kMiB);
}

TEST(LimitResourceTest, ConcurrentThreadsNeverPassTheCap) {
  constexpr std::size_t kCapacity = 256 * kKiB;
  HostResource host;
  StatsResource below(host);  // sees what really reached the system
  LimitResource limit(below, kCapacity);
  std::atomic<std::uint64_t> refusals{0};
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 random(t);
      std::uniform_int_distribution<std::size_t> pages(1, 24);
      std::vector<std::pair<void*, std::size_t>> held;
      for (int i = 0; i < 1500; ++i) {
        const std::size_t bytes = pages(random) * 4 * kKiB;
        try {
          held.emplace_back(limit.allocate(bytes), bytes);
        } catch (const OutOfMemory&) {
          refusals.fetch_add(1);
        }
        if (held.size() > 3 || (!held.empty() && random() % 2 == 0)) {
          limit.deallocate(held.front().first, held.front().second);
          held.erase(held.begin());
        }
      }
      for (const auto& [ptr, bytes] : held) limit.deallocate(ptr, bytes);
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_LE(below.stats().peak_bytes, kCapacity);
  EXPECT_GT(refusals.load(), 0u) << "the test must actually run into the cap";
  EXPECT_EQ(limit.used(), 0u);
  EXPECT_EQ(below.stats().current_bytes, 0u);
}

TEST(LimitResourceTest, NameAndCapacityDescribeTheCap) {
  HostResource host;
  LimitResource limit(host, 8 * kGiB);
  EXPECT_EQ(limit.name(), "limit(host, 8.0 GiB)");
  EXPECT_EQ(limit.capacity(), 8 * kGiB);
  EXPECT_EQ(&limit.upstream(), &host);
}

TEST(LimitResourceTest, ALoweredCapRefusesUntilEnoughIsReturnedAndARaisedOneGrantsMore) {
  HostResource host;
  LimitResource limit(host, kMiB);
  void* first = limit.allocate(768 * kKiB);
  limit.set_capacity(512 * kKiB);  // below what is in use: nothing is taken back
  EXPECT_EQ(limit.capacity(), 512 * kKiB);
  EXPECT_EQ(limit.used(), 768 * kKiB);
  EXPECT_EQ(limit.available(), 0u);
  EXPECT_THROW(limit.allocate(4 * kKiB), OutOfMemory);
  limit.deallocate(first, 768 * kKiB);
  void* second = limit.allocate(512 * kKiB);
  EXPECT_THROW(limit.allocate(4 * kKiB), OutOfMemory);
  limit.set_capacity(2 * kMiB);
  void* third = limit.allocate(kMiB);
  EXPECT_EQ(limit.used(), 1536 * kKiB);
  EXPECT_EQ(limit.name(), "limit(host, 2.0 MiB)");
  limit.deallocate(second, 512 * kKiB);
  limit.deallocate(third, kMiB);
  EXPECT_EQ(limit.used(), 0u);
}

TEST(LimitResourceTest, WithoutACapItCountsAndReportsTheUpstreamsNameAndCapacity) {
  HostResource host;
  LimitResource card(host, 8 * kMiB);
  LimitResource counting(card, LimitResource::kNoLimit);
  EXPECT_EQ(counting.name(), "limit(host, 8.0 MiB)");
  EXPECT_EQ(counting.capacity(), 8 * kMiB);
  void* block = counting.allocate(6 * kMiB);
  EXPECT_EQ(counting.used(), 6 * kMiB);
  EXPECT_THROW(counting.allocate(4 * kMiB), OutOfMemory) << "the upstream's cap still holds";
  EXPECT_EQ(counting.used(), 6 * kMiB) << "the upstream's refusal is undone";
  counting.set_capacity(4 * kMiB);
  EXPECT_EQ(counting.name(), "limit(limit(host, 8.0 MiB), 4.0 MiB)");
  counting.set_capacity(LimitResource::kNoLimit);
  EXPECT_EQ(counting.capacity(), 8 * kMiB);
  counting.deallocate(block, 6 * kMiB);
  EXPECT_EQ(counting.used(), 0u);
  EXPECT_EQ(card.used(), 0u);
}

TEST(LimitResourceTest, WithoutACapAboveOrBelowEverythingIsAvailable) {
  HostResource host;
  LimitResource limit(host, LimitResource::kNoLimit);
  EXPECT_EQ(limit.available(), LimitResource::kNoLimit) << "no cap above or below";
}

// ---------------------------------------------------------------------------------------
// StatsResource

TEST(StatsResourceTest, CountsCurrentPeakAndTotals) {
  HostResource host;
  StatsResource stats(host);
  void* a = stats.allocate(1000);
  void* b = stats.allocate(3000);
  stats.deallocate(a, 1000);
  void* c = stats.allocate(500);
  ResourceStats s = stats.stats();
  EXPECT_EQ(s.current_bytes, 3500u);
  EXPECT_EQ(s.peak_bytes, 4000u);
  EXPECT_EQ(s.total_bytes, 4500u);
  EXPECT_EQ(s.current_count, 2u);
  EXPECT_EQ(s.peak_count, 2u);
  EXPECT_EQ(s.allocations, 3u);
  EXPECT_EQ(s.deallocations, 1u);
  EXPECT_EQ(s.failures, 0u);
  stats.deallocate(b, 3000);
  stats.deallocate(c, 500);
  s = stats.stats();
  EXPECT_EQ(s.current_bytes, 0u);
  EXPECT_EQ(s.current_count, 0u);
  EXPECT_EQ(s.peak_bytes, 4000u);
  EXPECT_EQ(s.deallocations, 3u);
}

TEST(StatsResourceTest, ResetPeakLowersPeaksToCurrentFigures) {
  HostResource host;
  StatsResource stats(host);
  void* big = stats.allocate(10000);
  void* small = stats.allocate(100);
  stats.deallocate(big, 10000);
  stats.reset_peak();
  ResourceStats s = stats.stats();
  EXPECT_EQ(s.peak_bytes, 100u);
  EXPECT_EQ(s.peak_count, 1u);
  void* next = stats.allocate(50);
  EXPECT_EQ(stats.stats().peak_bytes, 150u);
  EXPECT_EQ(stats.stats().peak_count, 2u);
  stats.deallocate(next, 50);
  stats.deallocate(small, 100);
}

TEST(StatsResourceTest, FailedAllocationsAreCountedAsFailuresOnly) {
  RefusingResource refusing;
  StatsResource stats(refusing);
  EXPECT_THROW(stats.allocate(4096), OutOfMemory);
  const ResourceStats s = stats.stats();
  EXPECT_EQ(s.failures, 1u);
  EXPECT_EQ(s.allocations, 0u);
  EXPECT_EQ(s.current_bytes, 0u);
  EXPECT_EQ(s.total_bytes, 0u);
}

TEST(StatsResourceTest, ZeroByteRequestsAreNotCounted) {
  HostResource host;
  StatsResource stats(host);
  EXPECT_EQ(stats.allocate(0), nullptr);
  stats.deallocate(nullptr, 0);
  const ResourceStats s = stats.stats();
  EXPECT_EQ(s.allocations, 0u);
  EXPECT_EQ(s.deallocations, 0u);
}

TEST(StatsResourceTest, PeakCoversConcurrentAllocations) {
  HostResource host;
  StatsResource stats(host);
  constexpr int kThreads = 4;
  std::atomic<int> holding{0};
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      void* ptr = stats.allocate(4096);
      holding.fetch_add(1);
      while (holding.load() < kThreads) std::this_thread::yield();  // all live at once
      stats.deallocate(ptr, 4096);
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(stats.stats().peak_bytes, kThreads * 4096u);
  EXPECT_EQ(stats.stats().peak_count, static_cast<std::size_t>(kThreads));
  EXPECT_EQ(stats.stats().current_bytes, 0u);
}

TEST(StatsResourceTest, NameAndCapacityComeFromTheUpstream) {
  HostResource host;
  LimitResource limit(host, 2 * kMiB);
  StatsResource stats(limit);
  EXPECT_EQ(stats.name(), "stats(limit(host, 2.0 MiB))");
  EXPECT_EQ(stats.capacity(), 2 * kMiB);
}

// ---------------------------------------------------------------------------------------
// TraceResource

TEST(TraceResourceTest, WritesOneExactLinePerEvent) {
  HostResource host;
  std::ostringstream out;
  {
    TraceResource trace(host, out);
    void* a = trace.allocate(4096, Stream(0));
    void* b = trace.allocate(100, Stream(7));
    trace.deallocate(a, 4096, Stream(3));
    void* c = trace.allocate(1, Stream(0));
    trace.deallocate(c, 1, Stream(0));
    trace.deallocate(b, 100, Stream(7));
    EXPECT_EQ(trace.events(), 6u);
  }
  EXPECT_EQ(out.str(),
            "op,id,size,stream\n"
            "a,0,4096,0\n"
            "a,1,100,7\n"
            "f,0,4096,3\n"
            "a,2,1,0\n"
            "f,2,1,0\n"
            "f,1,100,7\n");
}

TEST(TraceResourceTest, ZeroBytesNullFreesAndFailuresAreNotEvents) {
  HostResource host;
  LimitResource limit(host, 8 * kKiB);
  std::ostringstream out;
  TraceResource trace(limit, out);
  EXPECT_EQ(trace.allocate(0), nullptr);
  trace.deallocate(nullptr, 0);
  EXPECT_THROW(trace.allocate(16 * kKiB), OutOfMemory);
  void* ptr = trace.allocate(100);
  trace.deallocate(ptr, 100);
  EXPECT_EQ(trace.events(), 2u);
  EXPECT_EQ(out.str(), "op,id,size,stream\na,0,100,0\nf,0,100,0\n")
      << "the failed request must not use up an id";
}

TEST(TraceResourceTest, UnknownPointerIsRejectedAndNotForwarded) {
  HostResource host;
  StatsResource below(host);
  std::ostringstream out;
  TraceResource trace(below, out);
  int not_from_the_trace = 0;
  try {
    trace.deallocate(&not_from_the_trace, sizeof not_from_the_trace);
    FAIL() << "an unknown pointer was accepted";
  } catch (const InvalidPointer& error) {
    EXPECT_EQ(error.pointer, &not_from_the_trace);
  }
  void* ptr = trace.allocate(64);
  trace.deallocate(ptr, 64);
  EXPECT_THROW(trace.deallocate(ptr, 64), InvalidPointer) << "double free";
  EXPECT_EQ(below.stats().deallocations, 1u);
  EXPECT_EQ(trace.events(), 2u);
}

TEST(TraceResourceTest, FileTraceReadsBackAsTheSameEvents) {
  const std::string path = ::testing::TempDir() + "sdalloc_trace_resource_test.csv";
  HostResource host;
  {
    TraceResource trace(host, path);
    void* a = trace.allocate(300, Stream(2));
    void* b = trace.allocate(5000);
    trace.deallocate(a, 300, Stream(2));
    trace.deallocate(b, 5000);
  }  // flushed on destruction
  const EventTrace read = read_event_trace(path);
  ASSERT_EQ(read.events.size(), 4u);
  EXPECT_EQ(read.events[0].op, TraceEvent::Op::kAlloc);
  EXPECT_EQ(read.events[0].size, 300u);
  EXPECT_EQ(read.events[0].stream, 2u);
  EXPECT_EQ(read.events[3].op, TraceEvent::Op::kFree);
  EXPECT_EQ(read.events[3].id, 1u);
  EXPECT_EQ(read.peak_live_bytes(), 5300u);
  std::remove(path.c_str());
}

TEST(TraceResourceTest, UncreatableFileIsAnInvalidArgumentNamingThePath) {
  HostResource host;
  const std::string path = "/nonexistent-sdalloc-dir/trace.csv";
  try {
    TraceResource trace(host, path);
    FAIL() << "opened " << path;
  } catch (const InvalidArgument& error) {
    EXPECT_TRUE(Contains(error.what(), path));
  }
}

TEST(TraceResourceTest, ConcurrentCallsProduceAValidTrace) {
  HostResource host;
  std::ostringstream out;
  TraceResource trace(host, out);
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < 4; ++t) {
    threads.emplace_back([&trace, t] {
      for (std::size_t i = 1; i <= 300; ++i) {
        const std::size_t bytes = i * 64;
        void* ptr = trace.allocate(bytes, Stream(t));
        trace.deallocate(ptr, bytes, Stream(t));
      }
    });
  }
  for (auto& thread : threads) thread.join();
  trace.flush();
  std::istringstream in(out.str());
  const EventTrace read = parse_event_trace(in, "concurrent");  // throws if inconsistent
  EXPECT_EQ(read.events.size(), 2400u);
  EXPECT_EQ(trace.events(), 2400u);
}

TEST(TraceResourceTest, NameAndCapacityComeFromTheUpstream) {
  HostResource host;
  LimitResource limit(host, 4 * kKiB);
  std::ostringstream out;
  TraceResource trace(limit, out);
  EXPECT_EQ(trace.name(), "trace(limit(host, 4.0 KiB))");
  EXPECT_EQ(trace.capacity(), 4 * kKiB);
}

}  // namespace
}  // namespace sdalloc
