// stream_ordered_core.hpp - what every stream-ordered pool shares (internal).
//
// CachingPool and VirtualMemoryPool are the same machine over different memory: per-stream
// shards of blocks (pool_shard.hpp), frees that wait for other streams' events, the same
// request checks and error messages, the same figures and invariants. This base class holds
// that machine once (RMM keeps it in its stream-ordered resource base); a pool derives from
// it and adds how it gets memory: segments from a resource, or pages mapped into ranges.
//
// Registry: a shard is keyed by (stream, kind); kind is the pool's class of shard (0 for
// CachingPool; small or large for VirtualMemoryPool). Shards are never removed, so a
// published table stays valid: a new key publishes a copy with one more entry, and the old
// copy is kept until the pool dies. A lookup reads the table without a lock; the table
// holds each key beside its shard so a lookup never reads another shard's cache lines.
//
// Locks: every shard has its own lock; the core never holds two at once, except while
// walking every shard for check_invariants (taken in table order, while no slow path waits
// on two). The hooks below are virtual and called on slow paths only: the hot path (a cache
// hit) stays in the derived pool, in a few lines over shard_for, check_request and fit_for,
// which are inline here.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/bits.hpp"
#include "pool/block.hpp"
#include "pool/block_limits.hpp"
#include "pool/pool_shard.hpp"
#include "pool/spin_lock.hpp"
#include "sdalloc/core/errors.hpp"
#include "sdalloc/core/pool_stats.hpp"
#include "sdalloc/core/stream.hpp"
#include "sdalloc/core/stream_events.hpp"

namespace sdalloc::detail {

// "0x..." for messages.
std::string pointer_text(const void* ptr);

class StreamOrderedCore {
 public:
  // The records a pool works with, named here once for every derived pool.
  using Block = ::sdalloc::detail::Block;
  using Fit = ::sdalloc::detail::Fit;
  using PoolShard = ::sdalloc::detail::PoolShard;
  using Segment = ::sdalloc::detail::Segment;

  struct ShardKey {
    Stream stream;
    std::uint32_t kind = 0;
    friend bool operator==(const ShardKey&, const ShardKey&) = default;
  };
  struct ShardTable {
    std::vector<ShardKey> keys;
    std::vector<PoolShard*> shards;  // shards[i] has keys[i]
  };

  explicit StreamOrderedCore(StreamEvents& events);
  StreamOrderedCore(const StreamOrderedCore&) = delete;
  StreamOrderedCore& operator=(const StreamOrderedCore&) = delete;
  virtual ~StreamOrderedCore();

  // --- hooks (slow paths only) ------------------------------------------------------------
  // "CachingPool(upstream)": the start of every message.
  virtual std::string name() const = 0;
  // What an OutOfMemory states about the pool.
  virtual OutOfMemoryInfo oom_info(std::size_t requested) const = 0;
  // A new shard for `key`; a pool that keeps more per shard answers its own derived type.
  // Called under the registry lock.
  virtual std::unique_ptr<PoolShard> make_shard(const ShardKey& key);
  // Ends a live allocation that free_slow found: called with the owner's lock held, before
  // the block leaves the live table (its requested size is still set).
  virtual void on_free(PoolShard& owner, const Block* block);
  // Returns a block whose frees are all done to `owner`'s free space. `lock` holds the
  // owner's lock; the pool may release it (to consolidate, say).
  virtual void recycle(PoolShard& owner, Block* block, std::unique_lock<SpinLock>& lock) = 0;
  // Gives one segment of `shard` back to where it came from and deletes its record; at
  // destruction only (release_all), so it must not throw.
  virtual void destroy_segment(PoolShard& shard, Segment* segment) noexcept = 0;

  // --- registry ---------------------------------------------------------------------------
  // The shard for (stream, kind), made on first use. Lock-free once it exists.
  PoolShard& shard_for(Stream stream, std::uint32_t kind = 0) {
    const ShardKey key{stream, kind};
    const ShardTable* t = table_.load(std::memory_order_acquire);
    for (std::size_t i = 0; i < t->keys.size(); ++i) {
      if (t->keys[i] == key) return *t->shards[i];
    }
    return add_shard(key);
  }
  // The shard for (stream, kind), or nullptr if none was made yet.
  PoolShard* find_shard(Stream stream, std::uint32_t kind = 0) const {
    const ShardKey key{stream, kind};
    const ShardTable* t = table_.load(std::memory_order_acquire);
    for (std::size_t i = 0; i < t->keys.size(); ++i) {
      if (t->keys[i] == key) return t->shards[i];
    }
    return nullptr;
  }
  // The published table as of now; it stays valid (and unchanged) while the pool lives.
  const ShardTable& table() const { return *table_.load(std::memory_order_acquire); }
  const std::vector<PoolShard*>& shards() const { return table().shards; }
  std::size_t stream_count() const;
  // Guards the registry; a pool may keep its own per-stream data under it too.
  std::mutex& registry_mutex() const { return registry_mutex_; }

  // --- requests ---------------------------------------------------------------------------
  // Throws InvalidArgument for a bad alignment, OutOfMemory (counted) for a size no pool
  // manages.
  void check_request(std::size_t bytes, std::size_t alignment) const {
    if (!is_power_of_two(alignment) || alignment > kMaxBlockAlignment ||
        bytes > kMaxBlockAllocation) [[unlikely]] {
      reject_request(bytes, alignment);
    }
  }
  // The rounded size and alignment of a request; not huge (CachingPool sets that).
  static Fit fit_for(std::size_t bytes, std::size_t alignment) {
    Fit fit;
    fit.rounded = round_up(bytes, kBlockRounding);
    fit.alignment = alignment > kBlockRounding ? alignment : kBlockRounding;
    fit.needed = fit.rounded + (fit.alignment - kBlockRounding);
    return fit;
  }

  // --- free -------------------------------------------------------------------------------
  // InvalidArgument if a deallocate states another size than was allocated.
  void check_size(const Block* block, const void* ptr, const std::size_t* expected) const {
    if (expected != nullptr && *expected != block->requested) [[unlikely]] {
      reject_size(block, ptr, *expected);
    }
  }
  // A free the fast path could not do: the pointer was allocated on another stream, or is
  // used by other streams (record_stream), or is not ours at all (InvalidPointer). The
  // owner reuses the block once every other stream's work queued so far is done.
  void free_slow(void* ptr, Stream stream, const std::size_t* expected_bytes);
  // Why a pointer is not a live allocation: a double free, an interior pointer, or foreign.
  std::string describe_foreign(std::uintptr_t addr) const;
  // The live block at ptr, its owner returned locked in *owner_out; InvalidPointer naming
  // `what` ("record_stream"), or none, otherwise.
  Block* find_live_anywhere(const void* ptr, PoolShard** owner_out,
                            const char* what = nullptr) const;
  void record_stream(void* ptr, Stream stream, const char* what = nullptr);
  std::size_t allocation_size(const void* ptr) const;

  // --- figures ----------------------------------------------------------------------------
  // The per-shard figures summed (see pool_shard.hpp for why they are per shard), with free
  // bytes, the largest free block (what a request would find: parked blocks merged with
  // their neighbours, though nothing is merged), pending bytes and the stream count. Reads
  // only: what a caller measures does not change what the pool does.
  PoolStats shard_stats() const;
  void reset_shard_peaks();
  std::atomic<std::uint64_t>& ooms() const { return ooms_; }
  std::atomic<std::uint64_t>& oom_retries() const { return oom_retries_; }

  // --- invariants -------------------------------------------------------------------------
  // The locks of `all` (a shards() answer), in table order.
  static std::vector<std::unique_lock<SpinLock>> lock_all(const std::vector<PoolShard*>& all);
  // Checks each of `all` (the caller holds their locks) and answers their segment bytes.
  static std::size_t check_shards(const std::vector<PoolShard*>& all);

  // --- lifetime ---------------------------------------------------------------------------
  // For the pool's destructor: waits for pending frees, drops record_stream lists, and gives
  // every segment back through destroy_segment.
  void release_all();

  StreamEvents& events;

 private:
  PoolShard& add_shard(const ShardKey& key);
  [[noreturn]] void reject_request(std::size_t bytes, std::size_t alignment) const;
  [[noreturn]] void reject_size(const Block* block, const void* ptr, std::size_t expected) const;

  std::atomic<const ShardTable*> table_{nullptr};
  mutable std::mutex registry_mutex_;
  std::vector<std::unique_ptr<ShardTable>> tables_;
  std::vector<std::unique_ptr<PoolShard>> owned_shards_;
  mutable std::atomic<std::uint64_t> ooms_{0};
  mutable std::atomic<std::uint64_t> oom_retries_{0};
};

}  // namespace sdalloc::detail
