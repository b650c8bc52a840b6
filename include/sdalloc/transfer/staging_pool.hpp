// sdalloc/transfer/staging_pool.hpp - pinned host memory under a byte budget, exact sizes.
//
// StagingPool hands out host blocks from an upstream resource (PinnedHostResource on a GPU,
// the HostCopyBackend's HostResource without one) and caches freed blocks for reuse by a
// request of the same size. Unlike PyTorch's pinned-memory allocator it never rounds a
// request up to a power of two: a block is the request rounded up to kMinAlignment (256 B),
// so the pool holds the bytes asked for (where the power-of-two policy holds up to 2x).
// Pinning is slow (cudaHostAlloc is a system call that locks pages), hence the cache.
//
// Invariants: held_bytes() (live + cached, what the upstream gave) never exceeds budget().
// A request that would cross it first releases cached blocks to the upstream; if the live
// blocks alone leave no room it waits for frees (WhenFull::kWait, up to wait_timeout) or
// fails at once (kFail). A request larger than the whole budget fails at once either way.
// Nothing is ever over-allocated.
//
// Bookkeeping the engine uses: state_of(p) says whether p lies in a live block, in a freed
// (cached) block - a use-after-free the engine refuses - or in neither.
//
// Errors: OutOfMemory (budget reached, after the wait when waiting) naming the request,
// live, held and the budget; InvalidPointer for a deallocate of a pointer that is not a
// live block's start. Thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <map>
#include <mutex>
#include <string>

#include "sdalloc/core/resource.hpp"

namespace sdalloc {

struct StagingPoolOptions {
  enum class WhenFull { kWait, kFail };
  std::size_t budget = std::size_t{256} << 20;  // most bytes held from the upstream
  WhenFull when_full = WhenFull::kWait;
  std::chrono::milliseconds wait_timeout{30000};
};

struct StagingPoolStats {
  std::size_t requested_bytes = 0;  // sum of live requests, as asked
  std::size_t live_bytes = 0;       // sum of live blocks (requests rounded to 256 B)
  std::size_t held_bytes = 0;       // live + cached blocks: what the upstream gave
  std::size_t peak_held_bytes = 0;
  std::size_t peak_requested_bytes = 0;
  std::size_t upstream_allocations = 0;
  std::size_t cache_hits = 0;
  std::size_t waits = 0;
};

class StagingPool {
 public:
  enum class BlockState { kNone, kLive, kFreed };

  StagingPool(MemoryResource& upstream, StagingPoolOptions options = {});
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;
  ~StagingPool();  // every block back to the upstream (live ones too: the owner is gone)

  void* allocate(std::size_t bytes);
  void deallocate(void* ptr);
  // Returns every cached block to the upstream; answers the bytes released.
  std::size_t trim();

  BlockState state_of(const void* ptr) const;
  StagingPoolStats stats() const;
  std::size_t budget() const { return options_.budget; }
  std::string name() const;  // "staging(<upstream>, <budget>)"

 private:
  struct Block {
    std::size_t size = 0;       // rounded
    std::size_t requested = 0;  // as asked (0 while cached)
    bool live = false;
  };
  bool release_cached_locked(std::size_t needed);

  MemoryResource& upstream_;
  StagingPoolOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable freed_;
  std::map<std::uintptr_t, Block> blocks_;             // by address, live and cached
  std::multimap<std::size_t, std::uintptr_t> cached_;  // by size
  StagingPoolStats stats_;
};

}  // namespace sdalloc
