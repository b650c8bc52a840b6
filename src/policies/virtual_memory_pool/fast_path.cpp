// fast_path.cpp - VirtualMemoryPool's allocate and free, and the levels of its slow path.
//
// Fast path: a quick-list hit (its pages are mapped by the invariant), or a best fit whose
// pages are all mapped; under the shard's lock only, with no system call. Anything else
// goes to allocate_slow, which tries in levels, retrying after each: (0) spares, pages of
// this shard's own free space, new chunks when the policy allows; (1) free pages of other
// idle shards, then new chunks; (2, out of memory) wait for pending
// frees and busy streams, take free pages from every shard. Each attempt hands the carved
// block to the shard with a backing hook (back_pages), so the shard makes it live only once
// its pages are mapped and frees it again otherwise; no shard lock is held while another is
// taken.

#include <algorithm>
#include <mutex>

#include "policies/virtual_memory_pool/vm_pool_impl.hpp"

namespace sdalloc {

using detail::Block;
using detail::Fit;
using detail::PoolShard;
using vm_detail::range_of;
using vm_detail::vm_shard;
using vm_detail::VmRange;

// =======================================================================================
// the fast path

bool VirtualMemoryPool::Impl::pages_mapped_for(const Block* found, const Fit& fit) {
  const VmRange& range = range_of(found);
  const std::uintptr_t start =
      (found->addr + fit.alignment - 1) & ~(static_cast<std::uintptr_t>(fit.alignment) - 1);
  const std::size_t end = range.end_page(start + fit.rounded);
  for (std::size_t p = range.first_page(start); p < end; ++p) {
    if (!range.is_mapped(p)) return false;
  }
  return true;
}

void* VirtualMemoryPool::Impl::allocate(std::size_t bytes, std::size_t alignment, Stream stream) {
  check_request(bytes, alignment);
  if (bytes == 0) return nullptr;
  const Fit fit = fit_for(bytes, alignment);
  VmShard& shard = vm_shard(shard_for(stream));
  {
    std::lock_guard lock(shard.mutex);
    auto mapped = [](const Block* found, const Fit& f) { return pages_mapped_for(found, f); };
    if (Block* block = shard.allocate(fit, bytes, mapped)) {
      shard.publish_live();
      return block->ptr();
    }
  }
  return allocate_slow(shard, fit, bytes);
}

void VirtualMemoryPool::Impl::free(void* ptr, Stream stream, const std::size_t* expected_bytes) {
  if (ptr == nullptr) return;
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  VmShard& shard = vm_shard(shard_for(stream));
  {
    std::lock_guard lock(shard.mutex);
    Block* block = shard.find_live(addr);
    // Used by other streams too: their work first, which free_slow waits for.
    if (block != nullptr && block->other_streams == nullptr) {
      check_size(block, ptr, expected_bytes);
      shard.forget_live(block);
      shard.publish_live();
      recycle_block(shard, block);
      return;
    }
  }
  free_slow(ptr, stream, expected_bytes);
}

void* VirtualMemoryPool::do_allocate(std::size_t bytes, Stream stream) {
  return impl_->allocate(bytes, kRounding, stream);
}

void* VirtualMemoryPool::allocate(std::size_t bytes, std::size_t alignment, Stream stream) {
  return impl_->allocate(bytes, alignment, stream);
}

void VirtualMemoryPool::do_deallocate(void* ptr, std::size_t bytes, Stream stream) {
  impl_->free(ptr, stream, &bytes);
}

void VirtualMemoryPool::free(void* ptr, Stream stream) { impl_->free(ptr, stream, nullptr); }

// =======================================================================================
// the slow path

void* VirtualMemoryPool::Impl::allocate_slow(PoolShard& shard, const Fit& fit, std::size_t bytes) {
  const std::size_t page_size = options.page_size;
  Attempt attempt;  // why the last level could not cover the block
  for (Level level : {Level::kOwn, Level::kOthers, Level::kOutOfMemory}) {
    if (attempt.final) break;
    if (level == Level::kOthers) {
      if (memory.can_move()) {
        // Other shards' free pages move under the request in one call per run (gather);
        // unmapped into the spares below only where that did not cover it.
        std::lock_guard lock(shard.mutex);
        if (void* ptr = try_allocate(shard, fit, bytes, level, attempt)) return ptr;
        if (attempt.final) break;
      }
      // What this shard lacked (else as many pages as the request can touch); other
      // streams keep the rest.
      const std::size_t want =
          attempt.short_pages != 0 ? attempt.short_pages : fit.needed / page_size + 2;
      steal_from_other_shards(shard, want, /*wait=*/false);
    } else if (level == Level::kOutOfMemory) {
      oom_retries().fetch_add(1, std::memory_order_relaxed);
      steal_from_other_shards(shard, SIZE_MAX, /*wait=*/true);
    }
    std::lock_guard lock(shard.mutex);
    if (level == Level::kOutOfMemory && !shard.pending.empty()) {
      shard.collect_pending(events, /*wait=*/true);
    }
    if (void* ptr = try_allocate(shard, fit, bytes, level, attempt)) return ptr;
  }
  // Out of every lock: oom_info takes them in turn.
  ooms().fetch_add(1, std::memory_order_relaxed);
  throw OutOfMemory::describe(name(), oom_info(bytes), oom_detail(attempt.failure));
}

// One attempt under the shard's lock: carve a block (reserving a new range if no free
// block fits), back its unmapped pages with chunks, make it live. Answers nullptr, with
// `failure` saying why, when the chunks could not all be had at this level; the block then
// goes back and nothing else changed. Errors other than a lack of memory propagate, also
// with nothing changed.
void* VirtualMemoryPool::Impl::try_allocate(PoolShard& shard, const Fit& fit, std::size_t bytes,
                                            Level level, Attempt& attempt) {
  shard.drain_quick_lists();
  Block* found = shard.find(fit);
  if (found == nullptr) {
    try {
      found = add_range(shard, fit);
    } catch (const OutOfMemory& e) {
      attempt = {std::string("reserving an address range failed: ") + e.what(), true};
      return nullptr;
    }
  }
  struct Context {
    Impl* pool;
    Level level;
    Attempt* attempt;
  } context{this, level, &attempt};
  const detail::BlockBacking backing{[](void* c, PoolShard& s, Block* block) {
                                       auto* ctx = static_cast<Context*>(c);
                                       return ctx->pool->back_pages(s, block, ctx->level,
                                                                    *ctx->attempt);
                                     },
                                     &context};
  Block* block = nullptr;
  try {
    block = shard.allocate_from(found, fit, bytes, backing);
  } catch (const OutOfMemory& e) {  // only map() lets one through
    attempt = {std::string("mapping a page failed (the request was rolled back): ") + e.what(),
               true};
    return nullptr;
  }
  if (block == nullptr) return nullptr;
  vm_shard(shard).publish_live();
  return block->ptr();
}

Block* VirtualMemoryPool::Impl::add_range(PoolShard& shard, const Fit& fit) {
  const std::size_t page_size = options.page_size;
  const std::size_t size = std::max(options.range_size, round_up(fit.needed, page_size));
  void* base = nullptr;
  try {
    base = memory.reserve(size, page_size);
  } catch (const OutOfMemory&) {
    throw;  // try_allocate turns it into the pool's OutOfMemory, out of the lock
  } catch (const Error& e) {
    throw Error(name() + ": reserving an address range of " + format_bytes(size) +
                " failed: " + e.what());
  }
  auto range = std::make_unique<VmRange>();
  range->base = reinterpret_cast<std::uintptr_t>(base);
  range->size = size;
  range->page_size = page_size;
  range->used = true;
  try {
    Block* block = shard.add_segment(range.get());
    counters.address_space.add(size);
    counters.ranges.add(1);
    (void)range.release();  // the shard's segment list owns it now
    return block;
  } catch (...) {
    memory.release(base, size);
    throw;
  }
}

}  // namespace sdalloc
