// CachingPool with CudaStreamEvents on a real device (skipped where there is none): a
// block freed on a stream whose work is still queued is not handed to another stream until
// that work has run; record_stream is honoured the same way; the allocation path only
// polls (a blocked stream never blocks an allocation); events are created once and reused.
// Streams are held busy with StreamGate (a host function that waits), so the tests do not
// depend on how long kernels take.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

#include "cuda_device_check.hpp"
#include "sdalloc/core/pool_layout.hpp"
#include "sdalloc/cuda/cuda_resource.hpp"
#include "sdalloc/cuda/cuda_stream_events.hpp"
#include "sdalloc/policies/caching_pool.hpp"
#include "stream_gate.hpp"

namespace sdalloc::cuda {
namespace {

constexpr std::size_t kSize = std::size_t{1} << 20;

class CudaStreamOrder : public ::testing::Test {
 protected:
  void SetUp() override {
    SDALLOC_REQUIRE_CUDA_DEVICE();
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_TRUE(compute_.ok() && copy_.ok());
    resource_ = std::make_unique<CudaResource>(0);
    events_ = std::make_unique<CudaStreamEvents>(0);
    CachingPoolOptions options;
    options.stream_events = events_.get();
    pool_ = std::make_unique<CachingPool>(*resource_, options);
  }
  void TearDown() override {
    pool_.reset();
    events_.reset();
    resource_.reset();
  }
  Stream compute() const { return Stream::from_native(compute_.get()); }
  Stream copy() const { return Stream::from_native(copy_.get()); }

  // Allocates on `stream` until `target` comes back or 64 allocations passed; frees them.
  bool gets_back(void* target, Stream stream) {
    std::vector<void*> held;
    bool found = false;
    for (int i = 0; i < 64 && !found; ++i) {
      held.push_back(pool_->allocate(kSize, stream));
      found = held.back() == target;
    }
    for (void* p : held) pool_->deallocate(p, kSize, stream);
    return found;
  }

  // Whether `target` is cached again once the other stream's work is done. An allocation
  // polls the pending events; the block then lies in free space, though the pool may serve
  // later requests from blocks freed more recently (its quick lists) before reaching it, so
  // the test reads the layout rather than waiting for the address to come back.
  bool free_again(void* target, Stream stream) {
    pool_->deallocate(pool_->allocate(kSize, stream), kSize, stream);  // polls
    const auto addr = reinterpret_cast<std::uintptr_t>(target);
    for (const SegmentLayout& segment : pool_->layout().segments) {
      for (const BlockLayout& b : segment.blocks) {
        if (addr >= b.address && addr < b.address + b.size) return b.state == BlockState::kFree;
      }
    }
    return false;  // released: not cached either
  }

  test::OwnedStream compute_;
  test::OwnedStream copy_;
  std::unique_ptr<CudaResource> resource_;
  std::unique_ptr<CudaStreamEvents> events_;
  std::unique_ptr<CachingPool> pool_;
};

TEST_F(CudaStreamOrder, CrossStreamFreeIsReusedOnlyAfterTheStreamsWork) {
  void* block = pool_->allocate(kSize, compute());
  test::StreamGate gate(copy_.get());
  ASSERT_EQ(gate.close(), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(block, 1, kSize, copy_.get()), cudaSuccess);  // queued, waiting
  pool_->deallocate(block, kSize, copy());
  EXPECT_EQ(pool_->stats().pending_free_bytes, 1u << 20);

  EXPECT_FALSE(gets_back(block, compute())) << "handed out while the copy stream still used it";
  gate.open();
  ASSERT_EQ(cudaStreamSynchronize(copy_.get()), cudaSuccess);
  EXPECT_TRUE(free_again(block, compute())) << "not reusable once the copy stream finished";
  EXPECT_EQ(pool_->stats().pending_free_bytes, 0u);
  EXPECT_NO_THROW(pool_->check_invariants());
}

TEST_F(CudaStreamOrder, RecordStreamDelaysReuse) {
  void* block = pool_->allocate(kSize, compute());
  pool_->record_stream(block, copy());
  test::StreamGate gate(copy_.get());
  ASSERT_EQ(gate.close(), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(block, 2, kSize, copy_.get()), cudaSuccess);
  pool_->deallocate(block, kSize, compute());  // freed on its own stream, used by copy too

  EXPECT_FALSE(gets_back(block, compute())) << "handed out while the recorded stream used it";
  gate.open();
  ASSERT_EQ(cudaStreamSynchronize(copy_.get()), cudaSuccess);
  EXPECT_TRUE(free_again(block, compute()));
  EXPECT_EQ(pool_->stats().pending_free_bytes, 0u);
}

TEST_F(CudaStreamOrder, SameStreamFreeIsReusedAtOnce) {
  test::StreamGate gate(compute_.get());
  ASSERT_EQ(gate.close(), cudaSuccess);
  void* block = pool_->allocate(kSize, compute());
  ASSERT_EQ(cudaMemsetAsync(block, 3, kSize, compute_.get()), cudaSuccess);
  pool_->deallocate(block, kSize, compute());
  void* again = pool_->allocate(kSize, compute());
  EXPECT_EQ(again, block) << "later work on the same stream runs after the free";
  pool_->deallocate(again, kSize, compute());
}

TEST_F(CudaStreamOrder, EventsAreReusedInSteadyState) {
  for (int i = 0; i < 100; ++i) {
    void* p = pool_->allocate(kSize, compute());
    ASSERT_EQ(cudaMemsetAsync(p, 4, kSize, copy_.get()), cudaSuccess);
    pool_->deallocate(p, kSize, copy());
    ASSERT_EQ(cudaStreamSynchronize(copy_.get()), cudaSuccess);
  }
  EXPECT_LE(events_->events_created(), 2u);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "cudaErrorNotReady answers must be cleared";
}

TEST_F(CudaStreamOrder, TrimWaitsForPendingFrees) {
  void* block = pool_->allocate(kSize, compute());
  ASSERT_EQ(cudaMemsetAsync(block, 5, kSize, copy_.get()), cudaSuccess);
  pool_->deallocate(block, kSize, copy());
  EXPECT_GT(pool_->trim(), 0u);
  EXPECT_EQ(pool_->stats().reserved_bytes, 0u);
}

}  // namespace
}  // namespace sdalloc::cuda
