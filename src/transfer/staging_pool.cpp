// staging_pool.cpp - exact-size blocks under a budget: reuse, release cache, wait, fail.
#include "sdalloc/transfer/staging_pool.hpp"

#include <algorithm>
#include <iterator>
#include <vector>

#include "core/bits.hpp"
#include "sdalloc/core/errors.hpp"

namespace sdalloc {

StagingPool::StagingPool(MemoryResource& upstream, StagingPoolOptions options)
    : upstream_(upstream), options_(options) {
  if (options_.budget == 0) throw InvalidArgument("StagingPool: the budget is 0 bytes");
}

StagingPool::~StagingPool() {
  for (const auto& [address, block] : blocks_) {
    upstream_.deallocate(reinterpret_cast<void*>(address), block.size);
  }
}

std::string StagingPool::name() const {
  return "staging(" + upstream_.name() + ", " + format_size(options_.budget) + ")";
}

bool StagingPool::release_cached_locked(std::size_t needed) {
  // Largest cached blocks first: the fewest slow unpin calls for the room needed.
  while (stats_.held_bytes + needed > options_.budget && !cached_.empty()) {
    const auto largest = std::prev(cached_.end());
    const std::uintptr_t address = largest->second;
    const std::size_t size = largest->first;
    cached_.erase(largest);
    blocks_.erase(address);
    stats_.held_bytes -= size;
    upstream_.deallocate(reinterpret_cast<void*>(address), size);
  }
  return stats_.held_bytes + needed <= options_.budget;
}

void* StagingPool::allocate(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  std::unique_lock lock(mutex_);
  const auto describe = [&](const std::string& why) {
    return OutOfMemory::describe(
        name(),
        OutOfMemoryInfo{bytes, stats_.requested_bytes, stats_.held_bytes, 0, options_.budget}, why);
  };
  // Checked before rounding, which would wrap near SIZE_MAX.
  if (bytes > options_.budget) throw describe("the request is larger than the whole budget");
  const std::size_t size = round_up(bytes, kMinAlignment);
  if (size > options_.budget) throw describe("the request is larger than the whole budget");
  const auto take = [&](std::uintptr_t address) {
    Block& block = blocks_[address];
    block.live = true;
    block.requested = bytes;
    stats_.requested_bytes += bytes;
    stats_.live_bytes += block.size;
    stats_.peak_requested_bytes = std::max(stats_.peak_requested_bytes, stats_.requested_bytes);
    return reinterpret_cast<void*>(address);
  };
  if (const auto hit = cached_.find(size); hit != cached_.end()) {
    const std::uintptr_t address = hit->second;
    cached_.erase(hit);
    ++stats_.cache_hits;
    return take(address);
  }
  if (!release_cached_locked(size)) {
    if (options_.when_full == StagingPoolOptions::WhenFull::kFail) {
      throw describe("the budget is reached (when_full = fail)");
    }
    ++stats_.waits;
    const bool room = freed_.wait_for(lock, options_.wait_timeout, [&] {
      if (const auto hit = cached_.find(size); hit != cached_.end()) return true;
      return release_cached_locked(size);
    });
    if (!room) throw describe("the budget stayed reached for the whole wait_timeout");
    if (const auto hit = cached_.find(size); hit != cached_.end()) {
      const std::uintptr_t address = hit->second;
      cached_.erase(hit);
      ++stats_.cache_hits;
      return take(address);
    }
  }
  // Reserve the bytes before the slow upstream call so no other thread can cross the budget.
  stats_.held_bytes += size;
  lock.unlock();
  void* ptr = nullptr;
  try {
    ptr = upstream_.allocate(size);
  } catch (...) {
    lock.lock();
    stats_.held_bytes -= size;
    throw;
  }
  lock.lock();
  ++stats_.upstream_allocations;
  stats_.peak_held_bytes = std::max(stats_.peak_held_bytes, stats_.held_bytes);
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  blocks_[address] = Block{size, 0, false};
  return take(address);
}

void StagingPool::deallocate(void* ptr) {
  if (ptr == nullptr) return;
  {
    const std::lock_guard lock(mutex_);
    const auto it = blocks_.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == blocks_.end() || !it->second.live) {
      throw InvalidPointer(name() + ": deallocate of a pointer that is not a live block (" +
                               (it == blocks_.end() ? "never handed out" : "already freed") + ")",
                           ptr);
    }
    Block& block = it->second;
    stats_.requested_bytes -= block.requested;
    stats_.live_bytes -= block.size;
    block.live = false;
    block.requested = 0;
    cached_.emplace(block.size, it->first);
  }
  freed_.notify_all();
}

std::size_t StagingPool::trim() {
  const std::lock_guard lock(mutex_);
  std::size_t released = 0;
  for (const auto& [size, address] : cached_) {
    upstream_.deallocate(reinterpret_cast<void*>(address), size);
    blocks_.erase(address);
    released += size;
  }
  cached_.clear();
  stats_.held_bytes -= released;
  return released;
}

StagingPool::BlockState StagingPool::state_of(const void* ptr) const {
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  const std::lock_guard lock(mutex_);
  auto it = blocks_.upper_bound(address);
  if (it == blocks_.begin()) return BlockState::kNone;
  --it;
  if (address >= it->first + it->second.size) return BlockState::kNone;
  return it->second.live ? BlockState::kLive : BlockState::kFreed;
}

StagingPoolStats StagingPool::stats() const {
  const std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace sdalloc
