// TorchCachingModel without expandable segments (tools/sdalloc/replay/torch_caching_model.hpp):
// one test per rule of PyTorch's native caching allocator that the model follows.
#include "replay/torch_caching_model.hpp"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstring>
#include <map>
#include <string>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/resources/limit_resource.hpp"
#include "support/test_support.hpp"

namespace sdalloc::replay {
namespace {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;

// Segments one after another in one mapping, never reused: two segments taken in a row are
// neighbours in memory, so a model that merged by address instead of by segment would show.
class AdjacentSegments final : public MemoryResource {
 public:
  AdjacentSegments() {
    void* p = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw Error("AdjacentSegments: mmap failed");
    base_ = static_cast<char*>(p);
  }
  ~AdjacentSegments() override { ::munmap(base_, kBytes); }
  std::string name() const override { return "adjacent"; }
  std::size_t live_segments() const { return live_.size(); }

 private:
  static constexpr std::size_t kBytes = std::size_t{64} << 30;
  void* do_allocate(std::size_t bytes, Stream) override {
    if (bytes > kBytes - used_) throw OutOfMemory("adjacent: full", OutOfMemoryInfo{});
    char* p = base_ + used_;
    used_ += bytes;
    live_[p] = bytes;
    return p;
  }
  void do_deallocate(void* ptr, std::size_t bytes, Stream) override {
    const auto it = live_.find(static_cast<char*>(ptr));
    if (it == live_.end() || it->second != bytes) throw InvalidArgument("adjacent: bad free");
    live_.erase(it);
  }
  char* base_ = nullptr;
  std::size_t used_ = 0;
  std::map<char*, std::size_t> live_;
};

char* as_bytes(void* p) { return static_cast<char*>(p); }

TEST(TorchCachingModel, RoundsSizesUpToMultiplesOf512Bytes) {
  EXPECT_EQ(torch_round_size(1), 512u);
  EXPECT_EQ(torch_round_size(512), 512u);
  EXPECT_EQ(torch_round_size(513), 1024u);
  EXPECT_EQ(torch_round_size(3 * MiB + 1), 3 * MiB + 512);
  AdjacentSegments device;
  TorchCachingModel model(device);
  void* a = model.allocate(1);
  void* b = model.allocate(513);
  void* c = model.allocate(100);
  EXPECT_EQ(model.block_bytes(a), 512u);
  EXPECT_EQ(model.block_bytes(b), 1024u);
  // Packed one after another in the small pool's first segment.
  EXPECT_EQ(as_bytes(b), as_bytes(a) + 512);
  EXPECT_EQ(as_bytes(c), as_bytes(b) + 1024);
  EXPECT_EQ(model.counters().allocated_bytes, 2048u);
}

TEST(TorchCachingModel, SegmentSizeFollowsTheRequestsSizeClass) {
  struct Case {
    std::size_t request, segment;
    bool small;
  };
  const Case cases[] = {
      {1, 2 * MiB, true},                   // small pool: 2 MiB segments
      {1 * MiB, 2 * MiB, true},             // 1 MiB is still small
      {1 * MiB + 1, 20 * MiB, false},       // 1-10 MiB: a 20 MiB segment
      {10 * MiB - 512, 20 * MiB, false},    //
      {10 * MiB, 10 * MiB, false},          // from 10 MiB: its own, rounded to 2 MiB
      {10 * MiB + 1, 12 * MiB, false},      //
      {100 * MiB + 512, 102 * MiB, false},  //
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.request);
    EXPECT_EQ(torch_segment_size(torch_round_size(c.request)), c.segment);
    AdjacentSegments device;
    TorchCachingModel model(device);
    model.allocate(c.request);
    const std::vector<TorchSegmentView> segments = model.snapshot();
    ASSERT_EQ(segments.size(), 1u);
    EXPECT_EQ(segments[0].bytes, c.segment);
    EXPECT_EQ(segments[0].small, c.small);
    EXPECT_EQ(model.counters().reserved_bytes, c.segment);
  }
}

TEST(TorchCachingModel, SmallAndLargePoolsNeverShareASegment) {
  AdjacentSegments device;
  TorchCachingModel model(device);
  model.allocate(2 * MiB);  // a 20 MiB segment, 18 MiB of it free
  model.allocate(4 * KiB);  // small: a segment of its own
  EXPECT_EQ(model.counters().segment_allocations, 2u);
  EXPECT_EQ(model.counters().reserved_bytes, 22 * MiB);
}

TEST(TorchCachingModel, SmallPoolSplitsWhenAtLeast512BytesRemain) {
  AdjacentSegments device;
  TorchCachingModel model(device);
  void* a = model.allocate(1 * MiB);
  void* b = model.allocate(1 * MiB - 512);  // the rest of the segment less 512 B: split
  EXPECT_EQ(model.block_bytes(b), 1 * MiB - 512);
  void* c = model.allocate(512);  // the 512 B left over
  EXPECT_EQ(as_bytes(b), as_bytes(a) + 1 * MiB);
  EXPECT_EQ(as_bytes(c), as_bytes(b) + 1 * MiB - 512);
  EXPECT_EQ(model.counters().segment_allocations, 1u);
}

TEST(TorchCachingModel, LargePoolSplitsOnlyWhenMoreThan1MiBRemains) {
  {
    AdjacentSegments device;
    TorchCachingModel model(device);
    model.allocate(9 * MiB);                    // 20 MiB segment: 11 MiB left, split
    void* b = model.allocate(10 * MiB);         // from the 11 MiB block: 1 MiB would remain
    EXPECT_EQ(model.block_bytes(b), 11 * MiB);  // not split: the block is taken whole
    model.allocate(2 * MiB);                    // so this needs a new segment
    EXPECT_EQ(model.counters().segment_allocations, 2u);
  }
  {
    AdjacentSegments device;
    TorchCachingModel model(device);
    model.allocate(9 * MiB);
    void* b = model.allocate(10 * MiB - 512);  // 1 MiB + 512 B would remain: split
    EXPECT_EQ(model.block_bytes(b), 10 * MiB - 512);
    void* c = model.allocate(1 * MiB + 512);  // the remainder, exactly
    EXPECT_EQ(as_bytes(c), as_bytes(b) + 10 * MiB - 512);
    EXPECT_EQ(model.counters().segment_allocations, 1u);
  }
}

TEST(TorchCachingModel, MaxSplitSizeKeepsOversizeBlocksFromSmallerRequests) {
  AdjacentSegments device;
  TorchCachingModel unlimited(device);
  unlimited.deallocate(unlimited.allocate(40 * MiB), 40 * MiB);
  void* p = unlimited.allocate(12 * MiB);  // takes the cached 40 MiB block and splits it
  EXPECT_EQ(unlimited.block_bytes(p), 12 * MiB);
  EXPECT_EQ(unlimited.counters().segment_allocations, 1u);

  TorchCachingModel model(device, TorchCachingOptions{.max_split_size = 32 * MiB});
  void* big = model.allocate(40 * MiB);
  model.deallocate(big, 40 * MiB);
  void* q = model.allocate(12 * MiB);  // below max_split_size: never the oversize block
  EXPECT_NE(q, big);
  EXPECT_EQ(model.counters().segment_allocations, 2u);
  void* r = model.allocate(34 * MiB);  // above: takes it whole, never split
  EXPECT_EQ(r, big);
  EXPECT_EQ(model.block_bytes(r), 40 * MiB);
  EXPECT_EQ(model.counters().segment_allocations, 2u);
}

TEST(TorchCachingModel, OversizeBlockServesOnlyRequestsWithinKLargeBufferOfItsSize) {
  AdjacentSegments device;
  TorchCachingModel model(device, TorchCachingOptions{.max_split_size = 32 * MiB});
  void* big = model.allocate(60 * MiB);
  model.deallocate(big, 60 * MiB);
  void* a = model.allocate(40 * MiB);  // 60 >= 40 + 20: would waste 20 MiB, refused
  EXPECT_NE(a, big);
  EXPECT_EQ(model.counters().segment_allocations, 2u);
  model.deallocate(a, 40 * MiB);
  void* b = model.allocate(40 * MiB + 512);  // best fit: the 40 MiB block is too small
  EXPECT_EQ(b, big);                         // 60 < 40 MiB + 512 + 20 MiB: taken
  EXPECT_EQ(model.block_bytes(b), 60 * MiB);
  EXPECT_EQ(model.counters().segment_allocations, 2u);
}

TEST(TorchCachingModel, MaxSplitSizeOf20MiBOrLessIsRefused) {
  AdjacentSegments device;
  EXPECT_THROW(TorchCachingModel(device, TorchCachingOptions{.max_split_size = 20 * MiB}),
               InvalidArgument);
  EXPECT_NO_THROW(TorchCachingModel(device, TorchCachingOptions{.max_split_size = 21 * MiB}));
}

TEST(TorchCachingModel, WithMaxSplitSizeAFailedSegmentReleasesOnlyTheOversizeBlocksItNeeds) {
  AdjacentSegments device;
  LimitResource card(device, 100 * MiB);
  TorchCachingModel model(card, TorchCachingOptions{.max_split_size = 32 * MiB});
  void* a = model.allocate(40 * MiB);
  void* b = model.allocate(40 * MiB);
  model.deallocate(a, 40 * MiB);
  model.deallocate(b, 40 * MiB);
  model.allocate(25 * MiB);  // a 26 MiB segment does not fit beside 80 MiB cached
  const TorchCachingCounters c = model.counters();
  EXPECT_EQ(c.segment_releases, 1u);  // one 40 MiB block was enough
  EXPECT_EQ(c.cache_releases, 0u);    // the release of everything was not needed
  EXPECT_EQ(c.reserved_bytes, 66 * MiB);
  EXPECT_EQ(card.used(), 66 * MiB);
}

TEST(TorchCachingModel, FreedBlockIsReusedOnlyOnItsOwnStream) {
  AdjacentSegments device;
  TorchCachingModel model(device);
  for (const std::size_t bytes : {std::size_t{4} * KiB, 4 * MiB}) {
    SCOPED_TRACE(bytes);
    void* first = model.allocate(bytes, Stream(1));
    model.deallocate(first, bytes, Stream(1));
    const std::uint64_t segments = model.counters().segment_allocations;
    void* other = model.allocate(bytes, Stream(2));
    EXPECT_NE(other, first);
    EXPECT_EQ(model.counters().segment_allocations, segments + 1);  // a segment of its own
    EXPECT_EQ(model.allocate(bytes, Stream(1)), first);
  }
}

TEST(TorchCachingModel, FreeBlocksMergeOnlyWithinTheirSegment) {
  AdjacentSegments device;
  TorchCachingModel model(device);
  void* a = model.allocate(9 * MiB);  // segment 1: a, b and 2 MiB free
  void* b = model.allocate(9 * MiB);
  void* c = model.allocate(9 * MiB);  // segment 2, just after segment 1 in memory
  ASSERT_EQ(as_bytes(c), as_bytes(a) + 20 * MiB);
  model.deallocate(a, 9 * MiB);
  model.deallocate(c, 9 * MiB);
  model.deallocate(b, 9 * MiB);  // merges with both neighbours
  const std::vector<TorchSegmentView> segments = model.snapshot();
  ASSERT_EQ(segments.size(), 2u);
  for (const TorchSegmentView& s : segments) {
    EXPECT_EQ(s.block_sizes, std::vector<std::size_t>{20 * MiB});
    EXPECT_EQ(s.block_allocated, std::vector<bool>{false});
  }
  // 40 MiB lie free side by side, but in two segments: 30 MiB needs a third.
  model.allocate(30 * MiB);
  EXPECT_EQ(model.counters().segment_allocations, 3u);
}

TEST(TorchCachingModel, MemoryGoesBackOnlyWhenASegmentAllocationFails) {
  AdjacentSegments device;
  LimitResource card(device, 40 * MiB);
  TorchCachingModel model(card);
  void* keep = model.allocate(512);  // keeps the small pool's segment split
  std::memset(keep, 0x5a, 512);
  void* big = model.allocate(15 * MiB);
  model.deallocate(big, 15 * MiB);
  void* tiny = model.allocate(4 * KiB);
  model.deallocate(tiny, 4 * KiB);
  EXPECT_EQ(model.counters().segment_releases, 0u);  // freeing releases nothing
  EXPECT_EQ(card.used(), 18 * MiB);

  void* huge = model.allocate(30 * MiB);  // 18 + 30 > 40: release, then retry
  const TorchCachingCounters c = model.counters();
  EXPECT_EQ(c.cache_releases, 1u);
  EXPECT_EQ(c.segment_releases, 1u);  // the 16 MiB segment; the split small one stays
  EXPECT_EQ(c.reserved_bytes, 32 * MiB);
  EXPECT_EQ(card.used(), 32 * MiB);
  EXPECT_EQ(static_cast<unsigned char*>(keep)[511], 0x5a);

  // Nothing cached is left to release: out of memory, and nothing live is lost.
  try {
    model.allocate(10 * MiB);
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& error) {
    EXPECT_TRUE(test::Contains(error.what(), "torch-native"));
    EXPECT_EQ(error.info.requested, 10 * MiB);
    EXPECT_EQ(error.info.capacity, 40 * MiB);
  }
  EXPECT_EQ(model.counters().ooms, 1u);
  EXPECT_EQ(static_cast<unsigned char*>(keep)[0], 0x5a);
  model.deallocate(huge, 30 * MiB);
  model.deallocate(keep, 512);
  model.release_cached_blocks();  // empty_cache(): everything goes back
  EXPECT_EQ(card.used(), 0u);
  EXPECT_EQ(model.counters().reserved_bytes, 0u);
  EXPECT_EQ(device.live_segments(), 0u);
}

TEST(TorchCachingModel, BadFreesAreRefusedAndChangeNothing) {
  AdjacentSegments device;
  TorchCachingModel model(device);
  EXPECT_EQ(model.allocate(0), nullptr);
  model.deallocate(nullptr, 0);
  void* p = model.allocate(1000);
  int on_stack = 0;
  EXPECT_THROW(model.deallocate(&on_stack, 4), InvalidPointer);
  EXPECT_THROW(model.deallocate(as_bytes(p) + 512, 488), InvalidPointer);
  EXPECT_THROW(model.deallocate(p, 999), InvalidArgument);
  EXPECT_EQ(model.block_bytes(p), 1024u);  // still live
  model.deallocate(p, 1000);
  EXPECT_THROW(model.deallocate(p, 1000), InvalidPointer);  // double free
  EXPECT_EQ(model.counters().allocated_bytes, 0u);
}

TEST(TorchCachingModel, DestructorGivesEverySegmentBack) {
  AdjacentSegments device;
  {
    TorchCachingModel model(device);
    model.allocate(100);
    model.allocate(3 * MiB, Stream(7));
    model.deallocate(model.allocate(50 * MiB), 50 * MiB);
    EXPECT_EQ(device.live_segments(), 3u);
  }
  EXPECT_EQ(device.live_segments(), 0u);
}

}  // namespace
}  // namespace sdalloc::replay
