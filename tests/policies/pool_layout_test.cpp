// pool_layout_test.cpp - CachingPool::layout(), VirtualMemoryPool::layout() (runs of mapped
// pages) and the C API's layout and event-trace calls:
// blocks tile their segments and agree with the stats; the C copy matches the C++ one; a
// trace written while a pool serves is a valid event trace of exactly what happened after
// its start; every error path reports and leaves the pool usable.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "sdalloc/core/pool_layout.hpp"
#include "sdalloc/policies/caching_pool.hpp"
#include "sdalloc/policies/virtual_memory_pool.hpp"
#include "sdalloc/resources/host_resource.hpp"
#include "sdalloc/resources/host_virtual_memory.hpp"
#include "sdalloc/sdalloc.h"
#include "sdalloc/trace/event_trace.hpp"
#include "support/layout_checks.hpp"
#include "support/test_support.hpp"

namespace sdalloc {
namespace {

using test::Contains;

constexpr std::size_t kMiB = std::size_t{1} << 20;

TEST(PoolLayout, EmptyPoolHasNoSegments) {
  HostResource host;
  CachingPool pool(host);
  EXPECT_TRUE(pool.layout().segments.empty());
}

TEST(PoolLayout, BlocksTileSegmentsAndAgreeWithStats) {
  HostResource host;
  CachingPool pool(host);
  void* a = pool.allocate(1000);
  void* b = pool.allocate(3 * kMiB);
  void* c = pool.allocate(5000, Stream(7));
  pool.deallocate(pool.allocate(4096), 4096);  // a freed block stays in the layout as free

  EXPECT_EQ(test::expect_layout_matches_stats(pool), 3u);
  const PoolLayout layout = pool.layout();
  bool side_stream_seen = false;
  for (const SegmentLayout& s : layout.segments) side_stream_seen |= s.stream == Stream(7);
  EXPECT_TRUE(side_stream_seen);
  pool.deallocate(a, 1000);
  pool.deallocate(b, 3 * kMiB);
  pool.deallocate(c, 5000, Stream(7));
}

TEST(PoolLayout, BlockFreedOnAnotherStreamWhileRecordedIsShownLive) {
  // Host streams complete at once, so a cross-stream free is never pending for long; the
  // layout must still classify every block as one of the three states.
  HostResource host;
  CachingPool pool(host);
  void* p = pool.allocate(2048, Stream(1));
  pool.record_stream(p, Stream(2));
  const PoolLayout before = pool.layout();
  ASSERT_EQ(before.segments.size(), 1u);
  EXPECT_EQ(before.segments[0].blocks[0].state, BlockState::kLive);
  EXPECT_EQ(before.segments[0].blocks[0].requested, 2048u);
  pool.free(p, Stream(1));
  for (const SegmentLayout& s : pool.layout().segments) {
    for (const BlockLayout& b : s.blocks) EXPECT_NE(b.state, BlockState::kLive);
  }
}

TEST(PoolLayout, InitialReservationIsPinned) {
  HostResource host;
  CachingPoolOptions options;
  options.initial_reservation = 4 * kMiB;
  CachingPool pool(host, options);
  const PoolLayout layout = pool.layout();
  ASSERT_EQ(layout.segments.size(), 1u);
  EXPECT_TRUE(layout.segments[0].pinned);
  EXPECT_EQ(layout.segments[0].size, 4 * kMiB);
}

// A virtual-memory pool's segments are its runs of mapped pages: one while every page is
// mapped; the free pages between two live blocks unmapped (trim), two, the free block cut at
// their ends; the spare chunks in neither.
TEST(PoolLayout, VirtualMemoryPoolSegmentsAreRunsOfMappedPages) {
  constexpr std::size_t kPage = 64 * 1024;
  HostVirtualMemory memory;
  VirtualMemoryPool pool(memory, {.page_size = kPage});
  void* a = pool.allocate(1000);
  void* b = pool.allocate(3 * kMiB);
  void* c = pool.allocate(200 * 1024);
  PoolLayout layout = pool.layout();
  ASSERT_EQ(layout.segments.size(), 1u);
  EXPECT_EQ(test::expect_layout_matches_stats(pool), 3u);
  EXPECT_EQ(layout.segments[0].address, reinterpret_cast<std::uintptr_t>(a));
  pool.free(b);
  EXPECT_EQ(pool.trim(), 3 * kMiB - kPage) << "b's pages but the one it shares with a";
  layout = pool.layout();
  ASSERT_EQ(layout.segments.size(), 2u);
  EXPECT_EQ(test::expect_layout_matches_stats(pool), 2u);
  EXPECT_EQ(layout.segments[0].size, kPage);
  EXPECT_EQ(layout.segments[0].blocks.back().state, BlockState::kFree) << "b's first bytes";
  EXPECT_EQ(layout.segments[1].blocks.front().state, BlockState::kFree) << "b's last bytes";
  // A request that moves pages: spare chunks may appear, in no segment.
  void* d = pool.allocate(kMiB);
  EXPECT_EQ(test::expect_layout_matches_stats(pool), 3u);
  pool.free(d);
  pool.free(c);
  pool.free(a);
  EXPECT_EQ(test::expect_layout_matches_stats(pool), 0u);
}

// ------------------------------------------------------------------ C API

struct CPool {
  // The segment cache, with its segments of whole mmap'd memory.
  CPool() {
    sdalloc_pool_config_t config;
    sdalloc_pool_config_init(&config);
    config.mode = SDALLOC_MODE_POOL;
    EXPECT_EQ(sdalloc_pool_create(&config, &pool), SDALLOC_SUCCESS);
  }
  ~CPool() { sdalloc_pool_destroy(pool); }
  CPool(const CPool&) = delete;
  CPool& operator=(const CPool&) = delete;
  sdalloc_pool_t* pool = nullptr;
};

TEST(CApiLayout, CopyMatchesThePoolAndIsDetached) {
  CPool c;
  void* a = nullptr;
  void* b = nullptr;
  ASSERT_EQ(sdalloc_malloc(c.pool, 1000, nullptr, &a), SDALLOC_SUCCESS);
  ASSERT_EQ(sdalloc_malloc(c.pool, 3 * kMiB, nullptr, &b), SDALLOC_SUCCESS);
  sdalloc_layout_t* layout = nullptr;
  ASSERT_EQ(sdalloc_pool_layout(c.pool, &layout), SDALLOC_SUCCESS);
  ASSERT_EQ(sdalloc_free(c.pool, a, nullptr), SDALLOC_SUCCESS);  // the copy does not change

  sdalloc_stats_t stats{};
  stats.struct_size = sizeof stats;
  ASSERT_EQ(sdalloc_pool_stats(c.pool, &stats), SDALLOC_SUCCESS);
  std::size_t reserved = 0, live_blocks = 0, live_requested = 0;
  const std::size_t n = sdalloc_layout_segment_count(layout);
  ASSERT_GE(n, 1u);
  for (std::size_t i = 0; i < n; ++i) {
    sdalloc_segment_info_t seg{};
    seg.struct_size = sizeof seg;
    ASSERT_EQ(sdalloc_layout_segment(layout, i, &seg), SDALLOC_SUCCESS);
    reserved += seg.size;
    std::size_t covered = 0;
    for (std::size_t j = 0; j < seg.block_count; ++j) {
      sdalloc_block_info_t blk{};
      blk.struct_size = sizeof blk;
      ASSERT_EQ(sdalloc_layout_block(layout, i, j, &blk), SDALLOC_SUCCESS);
      EXPECT_EQ(blk.address, seg.address + covered);
      covered += blk.size;
      if (blk.state == SDALLOC_BLOCK_LIVE) {
        ++live_blocks;
        live_requested += blk.requested;
      }
    }
    EXPECT_EQ(covered, seg.size);
  }
  EXPECT_EQ(reserved, stats.reserved_bytes);
  EXPECT_EQ(live_blocks, 2u) << "taken before the free";
  EXPECT_EQ(live_requested, 1000 + 3 * kMiB);
  sdalloc_layout_destroy(layout);
  EXPECT_EQ(sdalloc_free(c.pool, b, nullptr), SDALLOC_SUCCESS);
}

TEST(CApiLayout, ErrorsNameTheProblem) {
  CPool c;
  sdalloc_layout_t* layout = reinterpret_cast<sdalloc_layout_t*>(0x1);
  EXPECT_EQ(sdalloc_pool_layout(nullptr, &layout), SDALLOC_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(layout, nullptr) << "out is cleared on failure";
  EXPECT_EQ(sdalloc_pool_layout(c.pool, nullptr), SDALLOC_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(sdalloc_last_error(), "sdalloc_pool_layout: out is NULL"));

  ASSERT_EQ(sdalloc_pool_layout(c.pool, &layout), SDALLOC_SUCCESS);
  EXPECT_EQ(sdalloc_layout_segment_count(layout), 0u);
  EXPECT_EQ(sdalloc_layout_segment_count(nullptr), 0u);
  sdalloc_segment_info_t seg{};
  seg.struct_size = sizeof seg;
  EXPECT_EQ(sdalloc_layout_segment(layout, 0, &seg), SDALLOC_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(sdalloc_last_error(), "segment index 0 is past the last segment"));
  sdalloc_layout_destroy(layout);

  void* p = nullptr;
  ASSERT_EQ(sdalloc_malloc(c.pool, 100, nullptr, &p), SDALLOC_SUCCESS);
  ASSERT_EQ(sdalloc_pool_layout(c.pool, &layout), SDALLOC_SUCCESS);
  seg.struct_size = 0;
  EXPECT_EQ(sdalloc_layout_segment(layout, 0, &seg), SDALLOC_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(sdalloc_last_error(), "struct_size is 0"));
  seg.struct_size = sizeof seg;
  ASSERT_EQ(sdalloc_layout_segment(layout, 0, &seg), SDALLOC_SUCCESS);
  sdalloc_block_info_t blk{};
  blk.struct_size = sizeof blk;
  EXPECT_EQ(sdalloc_layout_block(layout, 0, seg.block_count, &blk), SDALLOC_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(sdalloc_last_error(), "is past the last block of segment 0"));
  blk.struct_size = sizeof blk + 8;
  EXPECT_EQ(sdalloc_layout_block(layout, 0, 0, &blk), SDALLOC_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(sdalloc_last_error(), "header newer than the library"));
  EXPECT_EQ(sdalloc_layout_block(nullptr, 0, 0, &blk), SDALLOC_ERROR_INVALID_ARGUMENT);
  sdalloc_layout_destroy(layout);
  sdalloc_layout_destroy(nullptr);
  EXPECT_EQ(sdalloc_free(c.pool, p, nullptr), SDALLOC_SUCCESS);
}

TEST(CApiMemoryStatKey, ListsEveryKeyTheLookupAnswers) {
  CPool c;
  std::size_t count = 0;
  for (; const char* key = sdalloc_memory_stat_key(count); ++count) {
    std::int64_t value = -1;
    EXPECT_EQ(sdalloc_memory_stat(c.pool, key, &value), SDALLOC_SUCCESS) << key;
    EXPECT_EQ(value, 0) << key;
  }
  EXPECT_GE(count, 10u);
  EXPECT_EQ(sdalloc_memory_stat_key(count + 100), nullptr);
}

// ------------------------------------------------------------------ event trace

TEST(CApiTrace, RecordsWhatHappensBetweenStartAndStop) {
  test::TempDir dir;
  const std::string path = dir.file("trace.csv");
  CPool c;
  void* before = nullptr;
  ASSERT_EQ(sdalloc_malloc(c.pool, 64, nullptr, &before), SDALLOC_SUCCESS);
  ASSERT_EQ(sdalloc_pool_trace_start(c.pool, path.c_str()), SDALLOC_SUCCESS);
  void* a = nullptr;
  void* b = nullptr;
  auto* side = reinterpret_cast<sdalloc_stream_t>(std::uintptr_t{0x5500});
  ASSERT_EQ(sdalloc_malloc(c.pool, 4096, nullptr, &a), SDALLOC_SUCCESS);
  ASSERT_EQ(sdalloc_malloc_aligned(c.pool, 100, 4096, side, &b), SDALLOC_SUCCESS);
  ASSERT_EQ(sdalloc_free(c.pool, a, nullptr), SDALLOC_SUCCESS);
  ASSERT_EQ(sdalloc_free(c.pool, before, nullptr), SDALLOC_SUCCESS);           // not in the trace
  EXPECT_EQ(sdalloc_free(c.pool, a, nullptr), SDALLOC_ERROR_INVALID_POINTER);  // no event
  void* zero = nullptr;
  ASSERT_EQ(sdalloc_malloc(c.pool, 0, nullptr, &zero), SDALLOC_SUCCESS);  // no event
  std::uint64_t events = 0;
  ASSERT_EQ(sdalloc_pool_trace_stop(c.pool, &events), SDALLOC_SUCCESS);
  EXPECT_EQ(events, 3u);
  EXPECT_EQ(test::read_file(path), "op,id,size,stream\na,0,4096,0\na,1,100,1\nf,0,4096,0\n");
  const EventTrace trace = read_event_trace(path);  // valid for the replay tools
  EXPECT_EQ(trace.events.size(), 3u);
  ASSERT_EQ(sdalloc_free(c.pool, b, side), SDALLOC_SUCCESS);  // after stop: not written
  EXPECT_EQ(test::read_file(path).size(), std::string("op,id,size,stream\na,0,4096,0\n"
                                                      "a,1,100,1\nf,0,4096,0\n")
                                              .size());
}

TEST(CApiTrace, TensorsAreTraced) {
  test::TempDir dir;
  const std::string path = dir.file("tensors.csv");
  CPool c;
  ASSERT_EQ(sdalloc_pool_trace_start(c.pool, path.c_str()), SDALLOC_SUCCESS);
  const std::int64_t dims[2] = {4, 8};
  sdalloc_tensor_t t;
  ASSERT_EQ(sdalloc_tensor_alloc(c.pool, SDALLOC_DTYPE_FP16, 2, dims, nullptr, &t),
            SDALLOC_SUCCESS);
  ASSERT_EQ(sdalloc_tensor_free(c.pool, &t), SDALLOC_SUCCESS);
  ASSERT_EQ(sdalloc_pool_trace_stop(c.pool, nullptr), SDALLOC_SUCCESS);
  EXPECT_EQ(test::read_file(path), "op,id,size,stream\na,0,64,0\nf,0,64,0\n");
}

TEST(CApiTrace, ErrorsLeaveThePoolUsable) {
  test::TempDir dir;
  CPool c;
  EXPECT_EQ(sdalloc_pool_trace_start(nullptr, "x"), SDALLOC_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(sdalloc_pool_trace_start(c.pool, nullptr), SDALLOC_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(sdalloc_last_error(), "path is NULL"));
  EXPECT_EQ(sdalloc_pool_trace_start(c.pool, "/nonexistent-dir/trace.csv"),
            SDALLOC_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(sdalloc_last_error(), "cannot create trace file '/nonexistent-dir/"));
  std::uint64_t events = 7;
  EXPECT_EQ(sdalloc_pool_trace_stop(c.pool, &events), SDALLOC_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(events, 0u);
  EXPECT_TRUE(Contains(sdalloc_last_error(), "not recording"));
  const std::string path = dir.file("t.csv");
  ASSERT_EQ(sdalloc_pool_trace_start(c.pool, path.c_str()), SDALLOC_SUCCESS);
  EXPECT_EQ(sdalloc_pool_trace_start(c.pool, path.c_str()), SDALLOC_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(sdalloc_last_error(), "already recording to"));
  EXPECT_EQ(sdalloc_pool_trace_stop(nullptr, nullptr), SDALLOC_ERROR_INVALID_ARGUMENT);
  ASSERT_EQ(sdalloc_pool_trace_stop(c.pool, nullptr), SDALLOC_SUCCESS);
  // A second trace starts afresh: ids from 0 again.
  ASSERT_EQ(sdalloc_pool_trace_start(c.pool, path.c_str()), SDALLOC_SUCCESS);
  void* p = nullptr;
  ASSERT_EQ(sdalloc_malloc(c.pool, 10, nullptr, &p), SDALLOC_SUCCESS);
  ASSERT_EQ(sdalloc_pool_trace_stop(c.pool, nullptr), SDALLOC_SUCCESS);
  EXPECT_EQ(test::read_file(path), "op,id,size,stream\na,0,10,0\n");
  EXPECT_EQ(sdalloc_free(c.pool, p, nullptr), SDALLOC_SUCCESS);
}

TEST(CApiTrace, ConcurrentThreadsWriteAValidTrace) {
  test::TempDir dir;
  const std::string path = dir.file("mt.csv");
  CPool c;
  ASSERT_EQ(sdalloc_pool_trace_start(c.pool, path.c_str()), SDALLOC_SUCCESS);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&c, t] {
      auto* stream = reinterpret_cast<sdalloc_stream_t>(std::uintptr_t(t) << 8);
      for (int i = 0; i < 500; ++i) {
        void* p = nullptr;
        if (sdalloc_malloc(c.pool, std::size_t(64 + i), stream, &p) == SDALLOC_SUCCESS) {
          sdalloc_free(c.pool, p, stream);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::uint64_t events = 0;
  ASSERT_EQ(sdalloc_pool_trace_stop(c.pool, &events), SDALLOC_SUCCESS);
  EXPECT_EQ(events, 4000u);
  const EventTrace trace = read_event_trace(path);  // throws if a free precedes its alloc
  EXPECT_EQ(trace.events.size(), 4000u);
}

}  // namespace
}  // namespace sdalloc
