// stream_ordered_core_test.cpp - the shared core of the stream-ordered pools, on its own:
// the shard registry, request and size checks, the cross-stream free path, teardown, and
// PoolShard's backing hook (the step VirtualMemoryPool maps pages in).
//
// A minimal pool (TestPool) derives from the core and counts its hook calls. Segments have
// made-up addresses: the core and the shards only do arithmetic on them, never touch them.

#include "pool/stream_ordered_core.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace sdalloc::detail {
namespace {

constexpr std::uintptr_t kBase = std::uintptr_t{1} << 32;
constexpr std::size_t kSegmentSize = std::size_t{1} << 20;

// Events that never complete until the test says so.
class ManualEvents final : public StreamEvents {
 public:
  Event record(Stream) override { return ++recorded; }
  bool query(Event e) override { return e <= completed; }
  void synchronize(Event e) override { completed = std::max(completed, e); }
  void release(Event) override { ++released; }
  bool idle(Stream) override { return false; }

  Event recorded = 0;
  Event completed = 0;
  int released = 0;
};

class TestPool final : public StreamOrderedCore {
 public:
  explicit TestPool(StreamEvents& e) : StreamOrderedCore(e) {}
  ~TestPool() override { release_all(); }

  std::string name() const override { return "TestPool"; }
  OutOfMemoryInfo oom_info(std::size_t requested) const override {
    OutOfMemoryInfo info;
    info.requested = requested;
    return info;
  }
  void on_free(PoolShard&, const Block* block) override { freed_bytes += block->requested; }
  void recycle(PoolShard& owner, Block* block, std::unique_lock<SpinLock>&) override {
    ++recycled;
    owner.release(block);
  }
  void destroy_segment(PoolShard&, Segment* segment) noexcept override {
    ++destroyed;
    delete segment;
  }

  // A segment of made-up memory in the shard of `stream`, with one live allocation.
  void* allocate_in_new_segment(Stream stream, std::size_t bytes, std::uintptr_t base) {
    PoolShard& shard = shard_for(stream);
    std::lock_guard lock(shard.mutex);
    auto* segment = new Segment{};
    segment->base = base;
    segment->size = kSegmentSize;
    Block* block = shard.add_segment(segment);
    return shard.allocate_from(block, fit_for(bytes, kBlockRounding), bytes)->ptr();
  }

  std::size_t freed_bytes = 0;
  int recycled = 0;
  int destroyed = 0;
};

// --- registry --------------------------------------------------------------------------

TEST(StreamOrderedCoreRegistry, SameKeyAnswersSameShard) {
  TestPool pool(HostStreamEvents::instance());
  EXPECT_EQ(pool.find_shard(Stream(7)), nullptr);
  PoolShard& first = pool.shard_for(Stream(7));
  EXPECT_EQ(&pool.shard_for(Stream(7)), &first);
  EXPECT_EQ(pool.find_shard(Stream(7)), &first);
  EXPECT_EQ(first.stream, Stream(7));
}

TEST(StreamOrderedCoreRegistry, KindsOfOneStreamAreSeparateShardsOfOneStream) {
  TestPool pool(HostStreamEvents::instance());
  PoolShard& large = pool.shard_for(Stream(3), 0);
  PoolShard& small = pool.shard_for(Stream(3), 1);
  EXPECT_NE(&large, &small);
  pool.shard_for(Stream(4));
  EXPECT_EQ(pool.shards().size(), 3u);
  EXPECT_EQ(pool.stream_count(), 2u);
}

TEST(StreamOrderedCoreRegistry, PublishedTableStaysValidWhenShardsAreAdded) {
  TestPool pool(HostStreamEvents::instance());
  pool.shard_for(Stream(1));
  const auto& before = pool.table();
  for (std::uintptr_t s = 2; s < 20; ++s) pool.shard_for(Stream(s));
  ASSERT_EQ(before.shards.size(), 1u);  // the old table is kept, unchanged
  EXPECT_EQ(before.shards[0], pool.find_shard(Stream(1)));
  EXPECT_EQ(pool.shards().size(), 19u);
}

// --- requests --------------------------------------------------------------------------

TEST(StreamOrderedCoreRequests, BadAlignmentIsRejected) {
  TestPool pool(HostStreamEvents::instance());
  EXPECT_THROW(pool.check_request(64, 3), InvalidArgument);
  EXPECT_THROW(pool.check_request(64, 0), InvalidArgument);
  EXPECT_THROW(pool.check_request(64, kMaxBlockAlignment * 2), InvalidArgument);
  EXPECT_NO_THROW(pool.check_request(64, kMaxBlockAlignment));
  EXPECT_EQ(pool.ooms().load(), 0u);
}

TEST(StreamOrderedCoreRequests, OversizedRequestIsCountedOutOfMemory) {
  TestPool pool(HostStreamEvents::instance());
  try {
    pool.check_request(kMaxBlockAllocation + 1, kBlockRounding);
    FAIL() << "no OutOfMemory";
  } catch (const OutOfMemory& e) {
    EXPECT_NE(std::string(e.what()).find("TestPool"), std::string::npos) << e.what();
  }
  EXPECT_EQ(pool.ooms().load(), 1u);
  EXPECT_EQ(pool.shard_stats().ooms, 1u);
}

TEST(StreamOrderedCoreRequests, FitRoundsSizeAndAlignment) {
  const Fit fit = StreamOrderedCore::fit_for(1, 4096);
  EXPECT_EQ(fit.rounded, kBlockRounding);
  EXPECT_EQ(fit.alignment, 4096u);
  EXPECT_EQ(fit.needed, kBlockRounding + 4096 - kBlockRounding);
  EXPECT_FALSE(fit.huge);
  EXPECT_EQ(StreamOrderedCore::fit_for(513, 1).alignment, kBlockRounding);
}

// --- free ------------------------------------------------------------------------------

TEST(StreamOrderedCoreFree, ForeignPointerIsRejected) {
  TestPool pool(HostStreamEvents::instance());
  pool.allocate_in_new_segment(Stream(1), 1000, kBase);
  int outside = 0;
  try {
    pool.free_slow(&outside, Stream(1), nullptr);
    FAIL() << "no InvalidPointer";
  } catch (const InvalidPointer& e) {
    EXPECT_NE(std::string(e.what()).find("never allocated here"), std::string::npos) << e.what();
  }
  EXPECT_EQ(pool.recycled, 0);
}

TEST(StreamOrderedCoreFree, InteriorPointerAndDoubleFreeAreNamed) {
  TestPool pool(HostStreamEvents::instance());
  void* ptr = pool.allocate_in_new_segment(Stream(1), 1000, kBase);
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  EXPECT_NE(pool.describe_foreign(addr + 8).find("interior pointer"), std::string::npos);
  pool.free_slow(ptr, Stream(1), nullptr);
  EXPECT_NE(pool.describe_foreign(addr).find("double free"), std::string::npos);
  EXPECT_THROW(pool.free_slow(ptr, Stream(1), nullptr), InvalidPointer);
}

TEST(StreamOrderedCoreFree, WrongStatedSizeIsRejectedAndChangesNothing) {
  TestPool pool(HostStreamEvents::instance());
  void* ptr = pool.allocate_in_new_segment(Stream(1), 1000, kBase);
  const std::size_t wrong = 999;
  EXPECT_THROW(pool.free_slow(ptr, Stream(1), &wrong), InvalidArgument);
  EXPECT_EQ(pool.allocation_size(ptr), 1000u);
  const std::size_t right = 1000;
  pool.free_slow(ptr, Stream(1), &right);
  EXPECT_EQ(pool.recycled, 1);
}

TEST(StreamOrderedCoreFree, FreeOnAnIdleOtherStreamRecyclesAtOnce) {
  TestPool pool(HostStreamEvents::instance());  // host events: nothing to wait for
  void* ptr = pool.allocate_in_new_segment(Stream(1), 1000, kBase);
  pool.free_slow(ptr, Stream(2), nullptr);
  EXPECT_EQ(pool.freed_bytes, 1000u);
  EXPECT_EQ(pool.recycled, 1);
  const PoolStats s = pool.shard_stats();
  EXPECT_EQ(s.live_allocations, 0u);
  EXPECT_EQ(s.free_bytes, kSegmentSize);
  const auto& all = pool.shards();
  const auto locks = StreamOrderedCore::lock_all(all);
  EXPECT_EQ(StreamOrderedCore::check_shards(all), kSegmentSize);
}

TEST(StreamOrderedCoreFree, FreeOnABusyOtherStreamWaitsForItsEvent) {
  ManualEvents events;
  TestPool pool(events);
  void* ptr = pool.allocate_in_new_segment(Stream(1), 1000, kBase);
  pool.record_stream(ptr, Stream(3));
  pool.free_slow(ptr, Stream(2), nullptr);
  EXPECT_EQ(events.recorded, 2u);  // the freeing stream and the recorded one
  EXPECT_EQ(pool.recycled, 0);
  EXPECT_EQ(pool.freed_bytes, 1000u);
  PoolShard& owner = pool.shard_for(Stream(1));
  {
    std::lock_guard lock(owner.mutex);
    ASSERT_EQ(owner.pending.size(), 1u);
    EXPECT_FALSE(owner.collect_pending(events, /*wait=*/false));
    events.completed = events.recorded;
    EXPECT_TRUE(owner.collect_pending(events, /*wait=*/false));
    EXPECT_TRUE(owner.pending.empty());
  }
  EXPECT_EQ(events.released, 2);
  EXPECT_EQ(pool.shard_stats().pending_free_bytes, 0u);
}

TEST(StreamOrderedCoreFree, RecordStreamOfForeignPointerNamesTheCall) {
  TestPool pool(HostStreamEvents::instance());
  int outside = 0;
  try {
    pool.record_stream(&outside, Stream(2), "record_stream");
    FAIL() << "no InvalidPointer";
  } catch (const InvalidPointer& e) {
    EXPECT_NE(std::string(e.what()).find("TestPool: record_stream of"), std::string::npos)
        << e.what();
  }
}

TEST(StreamOrderedCoreLifetime, ReleaseAllGivesBackEverySegment) {
  ManualEvents events;
  int destroyed = 0;
  {
    TestPool pool(events);
    void* ptr = pool.allocate_in_new_segment(Stream(1), 1000, kBase);
    pool.allocate_in_new_segment(Stream(2), 1000, kBase + kSegmentSize);
    pool.free_slow(ptr, Stream(2), nullptr);  // pending at destruction
    pool.release_all();
    destroyed = pool.destroyed;
    EXPECT_EQ(events.released, 1);  // the pending free's event was waited for and released
  }
  EXPECT_EQ(destroyed, 2);
}

// --- PoolShard's backing hook ------------------------------------------------------------

struct Backing {
  enum class Answer { kBack, kRefuse, kThrow } answer = Answer::kBack;
  int calls = 0;
  bool saw_unindexed_busy_block = false;
  std::size_t seen_size = 0;

  BlockBacking hook() {
    return {[](void* c, PoolShard& shard, Block* block) {
              auto* self = static_cast<Backing*>(c);
              ++self->calls;
              self->seen_size = block->size;
              self->saw_unindexed_busy_block =
                  !block->free && !block->indexed && shard.find_live(block->addr) == nullptr;
              if (self->answer == Answer::kThrow) throw std::runtime_error("map failed");
              return self->answer == Answer::kBack;
            },
            this};
  }
};

class PoolShardBacking : public ::testing::Test {
 protected:
  PoolShardBacking() : shard(Stream(1)) {
    segment.base = kBase;
    segment.size = kSegmentSize;
    first = shard.add_segment(&segment);
  }
  ~PoolShardBacking() override { shard.remove_segment(&segment, /*keep_block=*/false); }

  void expect_unchanged() {
    std::size_t reserved = 0;
    shard.check(reserved);
    EXPECT_EQ(reserved, kSegmentSize);
    EXPECT_EQ(shard.free_bytes(), kSegmentSize);
    EXPECT_EQ(shard.figures.live_allocations, 0u);
    EXPECT_EQ(shard.figures.allocations, 0u);
    EXPECT_TRUE(segment.first->is_whole_segment());
  }

  PoolShard shard;
  Segment segment;
  Block* first = nullptr;
};

TEST_F(PoolShardBacking, BackedBlockGoesLiveAfterTheHook) {
  Backing backing;
  const Fit fit = StreamOrderedCore::fit_for(3000, kBlockRounding);
  Block* block = shard.allocate_from(first, fit, 3000, backing.hook());
  ASSERT_NE(block, nullptr);
  EXPECT_EQ(backing.calls, 1);
  EXPECT_TRUE(backing.saw_unindexed_busy_block);
  EXPECT_EQ(backing.seen_size, fit.rounded);  // carved before the hook sees it
  EXPECT_EQ(shard.find_live(block->addr), block);
  EXPECT_EQ(shard.figures.live_bytes, 3000u);
  std::size_t reserved = 0;
  shard.check(reserved);
  shard.forget_live(block);
  shard.make_free(block);
}

TEST_F(PoolShardBacking, RefusedBackingLeavesTheShardAsItWas) {
  Backing backing;
  backing.answer = Backing::Answer::kRefuse;
  const Fit fit = StreamOrderedCore::fit_for(3000, 4096);
  EXPECT_EQ(shard.allocate_from(first, fit, 3000, backing.hook()), nullptr);
  EXPECT_EQ(backing.calls, 1);
  expect_unchanged();
}

TEST_F(PoolShardBacking, ThrowingBackingPropagatesAndLeavesTheShardAsItWas) {
  Backing backing;
  backing.answer = Backing::Answer::kThrow;
  const Fit fit = StreamOrderedCore::fit_for(3000, kBlockRounding);
  EXPECT_THROW(shard.allocate_from(first, fit, 3000, backing.hook()), std::runtime_error);
  expect_unchanged();
}

TEST_F(PoolShardBacking, CacheHitSkipsABestFitThatIsNotReady) {
  const Fit fit = StreamOrderedCore::fit_for(3000, kBlockRounding);
  int asked = 0;
  auto not_ready = [&](const Block*, const Fit&) {
    ++asked;
    return false;
  };
  EXPECT_EQ(shard.allocate(fit, 3000, not_ready), nullptr);
  EXPECT_EQ(asked, 1);
  expect_unchanged();
}

}  // namespace
}  // namespace sdalloc::detail
