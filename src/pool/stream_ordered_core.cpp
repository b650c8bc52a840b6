// stream_ordered_core.cpp - the shared machine of the stream-ordered pools: registry,
// cross-stream frees, checks and their messages, figures, invariants and teardown.
//
// Nothing here is on a hot path; each function takes one shard lock at a time, except
// lock_all_shards (see stream_ordered_core.hpp).

#include "pool/stream_ordered_core.hpp"

#include <algorithm>
#include <cstdio>
#include <utility>

namespace sdalloc::detail {

std::string pointer_text(const void* ptr) {
  char text[32];
  std::snprintf(text, sizeof text, "%p", ptr);
  return text;
}

StreamOrderedCore::StreamOrderedCore(StreamEvents& e) : events(e) {
  tables_.push_back(std::make_unique<ShardTable>());
  table_.store(tables_.back().get(), std::memory_order_release);
}

StreamOrderedCore::~StreamOrderedCore() = default;

std::unique_ptr<PoolShard> StreamOrderedCore::make_shard(const ShardKey& key) {
  return std::make_unique<PoolShard>(key.stream);
}

void StreamOrderedCore::on_free(PoolShard&, const Block*) {}

// ---------------------------------------------------------------------------------------
// registry

PoolShard& StreamOrderedCore::add_shard(const ShardKey& key) {
  std::lock_guard lock(registry_mutex_);
  const ShardTable* t = table_.load(std::memory_order_acquire);
  for (std::size_t i = 0; i < t->keys.size(); ++i) {
    if (t->keys[i] == key) return *t->shards[i];
  }
  owned_shards_.push_back(make_shard(key));
  auto next = std::make_unique<ShardTable>(*t);
  next->keys.push_back(key);
  next->shards.push_back(owned_shards_.back().get());
  table_.store(next.get(), std::memory_order_release);
  tables_.push_back(std::move(next));
  return *owned_shards_.back();
}

std::size_t StreamOrderedCore::stream_count() const {
  std::vector<Stream> seen;
  for (const ShardKey& key : table().keys) {
    if (std::find(seen.begin(), seen.end(), key.stream) == seen.end()) seen.push_back(key.stream);
  }
  return seen.size();
}

// ---------------------------------------------------------------------------------------
// requests

void StreamOrderedCore::reject_request(std::size_t bytes, std::size_t alignment) const {
  if (!is_power_of_two(alignment) || alignment > kMaxBlockAlignment) {
    throw InvalidArgument(name() + ": alignment must be a power of two no larger than " +
                          std::to_string(kMaxBlockAlignment) + ", got " +
                          std::to_string(alignment));
  }
  ooms_.fetch_add(1, std::memory_order_relaxed);
  throw OutOfMemory::describe(name(), oom_info(bytes),
                              "larger than the largest allocation sdalloc manages (" +
                                  format_bytes(kMaxBlockAllocation) + ")");
}

// ---------------------------------------------------------------------------------------
// free

void StreamOrderedCore::reject_size(const Block* block, const void* ptr,
                                    std::size_t expected) const {
  throw InvalidArgument(name() + ": deallocate of " + pointer_text(ptr) + " states " +
                        std::to_string(expected) + " bytes, but it was allocated with " +
                        std::to_string(block->requested));
}

void StreamOrderedCore::free_slow(void* ptr, Stream stream, const std::size_t* expected_bytes) {
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  for (PoolShard* owner : shards()) {
    std::unique_lock lock(owner->mutex);
    Block* block = owner->find_live(addr);
    if (block == nullptr) continue;
    check_size(block, ptr, expected_bytes);
    // Work on these streams may still use the block; the owner may reuse it only after.
    PendingFree entry{block, {}};
    auto wait_for = [&](Stream user) {
      if (user == owner->stream) return;
      const StreamEvents::Event e = events.record(user);
      if (e != StreamEvents::kNoEvent) entry.events.push_back(e);
    };
    wait_for(stream);
    if (block->other_streams != nullptr) {
      for (const Stream user : *block->other_streams) wait_for(user);
      delete block->other_streams;
      block->other_streams = nullptr;
    }
    on_free(*owner, block);
    if (entry.events.empty()) {
      owner->forget_live(block);
      recycle(*owner, block, lock);
    } else {
      owner->pending.reserve(owner->pending.size() + 1);  // so the push cannot fail
      owner->forget_live(block);
      owner->pending.push_back(std::move(entry));
    }
    return;
  }
  throw InvalidPointer(
      name() + ": free of " + pointer_text(ptr) + ", which is " + describe_foreign(addr), ptr);
}

std::string StreamOrderedCore::describe_foreign(std::uintptr_t addr) const {
  for (PoolShard* shard : shards()) {
    std::lock_guard lock(shard->mutex);
    for (const Segment* s = shard->segments; s != nullptr; s = s->next) {
      if (addr < s->base || addr >= s->base + s->size) continue;
      for (const Block* b = s->first; b != nullptr; b = b->next) {
        if (addr < b->addr || addr >= b->end()) continue;
        if (b->free && addr == b->addr) return "already free (double free?)";
        if (!b->free && addr != b->addr) {
          return "inside a live allocation that starts at " + pointer_text(b->ptr()) +
                 " (interior pointer)";
        }
        return "inside this pool's memory but not the start of a live allocation "
               "(already freed?)";
      }
    }
  }
  return "not memory of this pool (never allocated here)";
}

Block* StreamOrderedCore::find_live_anywhere(const void* ptr, PoolShard** owner_out,
                                             const char* what) const {
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  for (PoolShard* shard : shards()) {
    shard->mutex.lock();
    if (Block* block = shard->find_live(addr)) {
      *owner_out = shard;  // returned locked
      return block;
    }
    shard->mutex.unlock();
  }
  if (what != nullptr) {
    throw InvalidPointer(
        name() + ": " + what + " of " + pointer_text(ptr) + ", which is " + describe_foreign(addr),
        ptr);
  }
  throw InvalidPointer(name() + ": " + pointer_text(ptr) + " is " + describe_foreign(addr), ptr);
}

void StreamOrderedCore::record_stream(void* ptr, Stream stream, const char* what) {
  if (ptr == nullptr) return;
  PoolShard* owner = nullptr;
  Block* block = find_live_anywhere(ptr, &owner, what);
  std::lock_guard lock(owner->mutex, std::adopt_lock);
  if (stream == owner->stream) return;
  if (block->other_streams == nullptr) block->other_streams = new std::vector<Stream>();
  std::vector<Stream>& users = *block->other_streams;
  if (std::find(users.begin(), users.end(), stream) == users.end()) users.push_back(stream);
}

std::size_t StreamOrderedCore::allocation_size(const void* ptr) const {
  PoolShard* owner = nullptr;
  const Block* block = find_live_anywhere(ptr, &owner);
  std::lock_guard lock(owner->mutex, std::adopt_lock);
  return block->requested;
}

// ---------------------------------------------------------------------------------------
// figures

PoolStats StreamOrderedCore::shard_stats() const {
  PoolStats s;
  for (PoolShard* shard : shards()) {
    std::lock_guard lock(shard->mutex);
    const ShardFigures& f = shard->figures;
    s.live_bytes += f.live_bytes;
    s.peak_live_bytes += f.peak_live_bytes;
    s.allocated_bytes += f.allocated_bytes;
    s.peak_allocated_bytes += f.peak_allocated_bytes;
    s.live_allocations += f.live_allocations;
    s.peak_live_allocations += f.peak_live_allocations;
    s.allocations += f.allocations;
    s.frees += f.frees;
    s.free_bytes += shard->free_bytes();
    s.largest_free_block = std::max(s.largest_free_block, shard->largest_free());
    s.pending_free_bytes += shard->pending_bytes();
    ++s.streams;
  }
  s.oom_retries = oom_retries_.load(std::memory_order_relaxed);
  s.ooms = ooms_.load(std::memory_order_relaxed);
  return s;
}

void StreamOrderedCore::reset_shard_peaks() {
  for (PoolShard* shard : shards()) {
    std::lock_guard lock(shard->mutex);
    shard->figures.reset_peak();
  }
}

// ---------------------------------------------------------------------------------------
// invariants

std::vector<std::unique_lock<SpinLock>> StreamOrderedCore::lock_all(
    const std::vector<PoolShard*>& all) {
  std::vector<std::unique_lock<SpinLock>> locks;
  locks.reserve(all.size());
  for (PoolShard* shard : all) locks.emplace_back(shard->mutex);
  return locks;
}

std::size_t StreamOrderedCore::check_shards(const std::vector<PoolShard*>& all) {
  std::size_t reserved = 0;
  for (const PoolShard* shard : all) shard->check(reserved);
  return reserved;
}

// ---------------------------------------------------------------------------------------
// lifetime

void StreamOrderedCore::release_all() {
  for (PoolShard* shard : shards()) {
    std::lock_guard lock(shard->mutex);
    shard->collect_pending(events, true);  // gives the events back
    shard->live.for_each([](std::uintptr_t, Block* block) {
      delete block->other_streams;
      block->other_streams = nullptr;
    });
    for (Segment* s = shard->segments; s != nullptr;) {
      Segment* next = s->next;
      destroy_segment(*shard, s);
      s = next;
    }
    shard->segments = nullptr;
  }
}

}  // namespace sdalloc::detail
