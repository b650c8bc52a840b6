// TorchCachingModel with expandable segments, over real host pages (HostVirtualMemory),
// and `sdalloc replay -a torch-native,torch-expandable` end to end.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "replay/torch_caching_model.hpp"
#include "sdalloc/core/errors.hpp"
#include "sdalloc/resources/host_virtual_memory.hpp"
#include "support/test_support.hpp"

namespace sdalloc::replay {
namespace {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;

char* as_bytes(void* p) { return static_cast<char*>(p); }

// A device of `bytes`: the model maps at most that much, in ranges of 1 1/8 times it.
HostVirtualMemory device_of(std::size_t bytes) {
  return HostVirtualMemory(HostVirtualMemoryOptions{.physical_limit = bytes});
}

TEST(TorchCachingExpandable, OneRangePerStreamAndPool) {
  HostVirtualMemory vm = device_of(256 * MiB);
  TorchCachingModel model(vm, TorchCachingOptions{});
  void* small0 = model.allocate(4 * KiB, Stream(0));
  void* large0 = model.allocate(4 * MiB, Stream(0));
  void* small1 = model.allocate(4 * KiB, Stream(1));
  void* small0_again = model.allocate(4 * KiB, Stream(0));
  void* large0_again = model.allocate(30 * MiB, Stream(0));
  EXPECT_EQ(model.counters().ranges, 3u);
  // Each range holds 1 1/8 of the device: 288 MiB in pages of 2 MiB or 20 MiB.
  EXPECT_EQ(vm.reserved_bytes(), 2 * 288 * MiB + 300 * MiB);
  EXPECT_EQ(as_bytes(small0_again), as_bytes(small0) + 4 * KiB);
  EXPECT_EQ(as_bytes(large0_again), as_bytes(large0) + 4 * MiB);
  EXPECT_NE(small1, small0_again);
}

TEST(TorchCachingExpandable, GrowsByMappingOnlyThePagesItLacks) {
  HostVirtualMemory vm = device_of(256 * MiB);
  TorchCachingModel model(vm, TorchCachingOptions{});
  void* a = model.allocate(3 * MiB);  // one 20 MiB page of the large pool
  EXPECT_EQ(model.counters().pages_mapped, 1u);
  void* b = model.allocate(18 * MiB);  // 17 MiB free at the end: one more page
  EXPECT_EQ(as_bytes(b), as_bytes(a) + 3 * MiB);
  EXPECT_EQ(model.counters().pages_mapped, 2u);
  void* c = model.allocate(39 * MiB);  // 19 MiB free at the end: one more page again
  EXPECT_EQ(as_bytes(c), as_bytes(b) + 18 * MiB);
  const TorchCachingCounters counters = model.counters();
  EXPECT_EQ(counters.pages_mapped, 3u);
  EXPECT_EQ(counters.reserved_bytes, 60 * MiB);
  EXPECT_EQ(counters.peak_reserved_bytes, 60 * MiB);
  EXPECT_EQ(vm.physical_bytes(), 60 * MiB);
  EXPECT_EQ(vm.mapped_bytes(), 60 * MiB);
  // Real memory across the pages' boundaries.
  std::memset(a, 1, 3 * MiB);
  std::memset(b, 2, 18 * MiB);
  std::memset(c, 3, 39 * MiB);
  EXPECT_EQ(as_bytes(b)[18 * MiB - 1], 2);
  EXPECT_EQ(as_bytes(c)[0], 3);
}

TEST(TorchCachingExpandable, SplitsAnyRemainderOfAtLeast512BytesInBothPools) {
  HostVirtualMemory vm = device_of(256 * MiB);
  TorchCachingModel model(vm, TorchCachingOptions{});
  void* a = model.allocate(19 * MiB);  // 1 MiB left of the page: split all the same
  EXPECT_EQ(model.block_bytes(a), 19 * MiB);
  void* b = model.allocate(1 * MiB + 512);  // lacks 512 B: maps the next page
  EXPECT_EQ(as_bytes(b), as_bytes(a) + 19 * MiB);
  EXPECT_EQ(model.counters().pages_mapped, 2u);
}

TEST(TorchCachingExpandable, BestFitTakesTheBlockThatCanGrowLast) {
  HostVirtualMemory vm = device_of(256 * MiB);
  TorchCachingModel model(vm, TorchCachingOptions{});
  void* a = model.allocate(5 * MiB);
  void* b = model.allocate(7 * MiB);
  model.allocate(3 * MiB);  // 5 MiB free at the end of the page, then unmapped space
  model.deallocate(b, 7 * MiB);
  // The end block is the smaller fit, but it reaches into the unmapped rest: the 7 MiB
  // block between live ones is taken instead.
  EXPECT_EQ(model.allocate(4 * MiB), b);
  EXPECT_EQ(as_bytes(b), as_bytes(a) + 5 * MiB);
  EXPECT_EQ(model.counters().pages_mapped, 1u);
}

TEST(TorchCachingExpandable, OutOfMemoryUnmapsWhollyFreePagesAndRetries) {
  HostVirtualMemory vm = device_of(100 * MiB);  // five pages of the large pool
  TorchCachingModel model(vm, TorchCachingOptions{});
  void* a = model.allocate(3 * MiB);
  void* b = model.allocate(50 * MiB);  // pages 0-2
  void* c = model.allocate(3 * MiB);
  std::memset(a, 0x11, 3 * MiB);
  std::memset(c, 0x33, 3 * MiB);
  model.deallocate(b, 50 * MiB);  // free 3-53 MiB: page 1 wholly, pages 0 and 2 in part
  EXPECT_EQ(model.counters().reserved_bytes, 60 * MiB);  // nothing unmapped on free

  // Another stream's range needs three pages; two are left: page 1 is unmapped.
  void* d = model.allocate(50 * MiB, Stream(1));
  TorchCachingCounters counters = model.counters();
  EXPECT_EQ(counters.cache_releases, 1u);
  EXPECT_EQ(counters.pages_unmapped, 1u);
  EXPECT_EQ(counters.reserved_bytes, 100 * MiB);
  EXPECT_EQ(vm.physical_bytes(), 100 * MiB);
  EXPECT_EQ(as_bytes(a)[3 * MiB - 1], 0x11);
  EXPECT_EQ(as_bytes(c)[0], 0x33);
  // Stream 0's range is mapped in two stretches now, pages 0 and 2; stream 1's in one.
  std::vector<TorchSegmentView> stream0;
  for (const TorchSegmentView& view : model.snapshot()) {
    if (view.stream == 0) stream0.push_back(view);
  }
  ASSERT_EQ(stream0.size(), 2u);
  EXPECT_EQ(stream0[0].base, as_bytes(a));
  EXPECT_EQ(stream0[0].bytes, 20 * MiB);
  EXPECT_EQ(stream0[1].base, as_bytes(a) + 40 * MiB);
  EXPECT_EQ(stream0[1].bytes, 20 * MiB);
  EXPECT_EQ(model.snapshot().size(), 3u);

  // The hole is refilled first, at the lowest address, once stream 1's pages go back.
  model.deallocate(d, 50 * MiB);
  void* e = model.allocate(20 * MiB);
  EXPECT_EQ(e, as_bytes(a) + 3 * MiB);
  counters = model.counters();
  EXPECT_EQ(counters.cache_releases, 2u);
  EXPECT_EQ(counters.ranges_released, 1u);  // stream 1's range, wholly unmapped
  EXPECT_EQ(counters.reserved_bytes, 60 * MiB);
  EXPECT_EQ(vm.physical_bytes(), 60 * MiB);
}

TEST(TorchCachingExpandable, OutOfMemoryWhenNothingCanBeUnmapped) {
  HostVirtualMemory vm = device_of(40 * MiB);
  TorchCachingModel model(vm, TorchCachingOptions{});
  void* a = model.allocate(30 * MiB);
  std::memset(a, 0x7e, 30 * MiB);
  try {
    model.allocate(30 * MiB, Stream(1));
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& error) {
    EXPECT_TRUE(test::Contains(error.what(), "torch-expandable"));
    EXPECT_EQ(error.info.capacity, 40 * MiB);
  }
  EXPECT_EQ(model.counters().ooms, 1u);
  EXPECT_EQ(as_bytes(a)[30 * MiB - 1], 0x7e);
  EXPECT_EQ(vm.physical_bytes(), model.counters().reserved_bytes);
  // More than a whole range: refused at once, no range reserved for it.
  const std::uint64_t ranges = model.counters().ranges;
  EXPECT_THROW(model.allocate(std::size_t{1} << 40), OutOfMemory);
  EXPECT_EQ(model.counters().ranges, ranges);
  model.deallocate(a, 30 * MiB);
}

TEST(TorchCachingExpandable, EmptyCacheGivesWhollyFreeRangesBack) {
  HostVirtualMemory vm = device_of(256 * MiB);
  {
    TorchCachingModel model(vm, TorchCachingOptions{});
    void* p = model.allocate(100 * KiB, Stream(3));
    void* q = model.allocate(5 * MiB, Stream(3));
    model.allocate(5 * MiB, Stream(4));  // stays live: its range stays
    model.deallocate(p, 100 * KiB);
    model.deallocate(q, 5 * MiB);
    model.release_cached_blocks();
    const TorchCachingCounters counters = model.counters();
    EXPECT_EQ(counters.ranges, 3u);
    EXPECT_EQ(counters.ranges_released, 2u);
    EXPECT_EQ(counters.reserved_bytes, 20 * MiB);
    EXPECT_EQ(vm.physical_bytes(), 20 * MiB);
    EXPECT_EQ(vm.reserved_bytes(), 300 * MiB);  // one range of 15 large pages
  }
  EXPECT_EQ(vm.reserved_bytes(), 0u);  // the destructor released the live block's range
  EXPECT_EQ(vm.physical_bytes(), 0u);
}

// ---------------------------------------------------------------------------- the CLI

struct CliRun {
  int status = -1;
  std::string out;
};

CliRun run_cli(const test::TempDir& dir, const std::string& args) {
  const std::string out = dir.file("stdout.txt");
  const std::string command = std::string("'") + SDALLOC_CLI + "' " + args + " >'" + out + "' 2>'" +
                              dir.file("stderr.txt") + "'";
  const int raw = std::system(command.c_str());
  return CliRun{WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, test::read_file(out)};
}

TEST(TorchCachingCli, ReplaysTheBundledTraceAndRunsOutOfMemoryUnderACap) {
  test::TempDir dir;
  const std::string trace =
      std::string(SDALLOC_DATA_DIR) + "/traces/torchvision_resnet50_b1_224_cpu_2pass.csv";
  // --touch writes every page handed out: the memory must be real.
  const CliRun run =
      run_cli(dir, "replay -q --touch -n 2 -a torch-native,torch-expandable '" + trace + "'");
  EXPECT_EQ(run.status, 0) << run.out;
  EXPECT_TRUE(test::Contains(run.out, "torch-native "));
  EXPECT_TRUE(test::Contains(run.out, "segments +3 -0, OOM releases 0"));
  EXPECT_TRUE(test::Contains(run.out, "torch-expandable "));
  EXPECT_TRUE(test::Contains(run.out, "maps 3 (3 pages), unmaps 0 (0 pages), ranges 2"));
  EXPECT_TRUE(test::Contains(run.out, "24.0 MiB"));

  const CliRun capped =
      run_cli(dir, "replay -q -a torch-native,torch-expandable --capacity 8M '" + trace + "'");
  EXPECT_EQ(capped.status, 3) << capped.out;
  EXPECT_TRUE(test::Contains(capped.out, "out of memory: torch-native"));
  EXPECT_TRUE(test::Contains(capped.out, "out of memory: torch-expandable"));
}

}  // namespace
}  // namespace sdalloc::replay
