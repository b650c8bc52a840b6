// pages.cpp - backing blocks with pages: gathering chunks, mapping, moving free pages.
//
// A block handed out must have every page it overlaps mapped (the invariant in
// vm_pool_impl.hpp). back_pages is the shard's backing hook: it counts the block's unmapped
// pages and gathers that many chunks from the spares, from free pages of this shard (or,
// at later levels, of other shards), and from the VirtualMemory, in the order the policy
// allows; then maps them, each run of unmapped pages in one call where the memory can
// (VirtualMemory::map_run: on the host one mmap). Free pages move where the memory can move
// (VirtualMemory::move: on the host the page tables come along, and a run of neighbours is
// one call): they stay mapped until then, so a page that is not needed after all has cost
// nothing. Whatever it cannot use goes back, so a failed attempt leaves the pool consistent
// (pages moved before a failure stay as spare chunks). A page is moved only when it lies
// wholly inside a free block.
//
// Mapping order: the chunks of each kind (moved, spare, created) go under a block in
// increasing handle order at increasing addresses. On the host, fresh pages mapped beside
// each other merge into one kernel mapping: 4 GiB of fresh 64 KiB pages is one mapping, not
// 65,536 (Linux allows 65,530 per process); chunks created one after another have handles
// that follow each other and move in one call.
//
// Rollback cannot throw: a page whose unmap fails stays mapped under free space, which the
// invariant allows, and the request's own error goes on.

#include <algorithm>
#include <mutex>
#include <utility>

#include "policies/virtual_memory_pool/vm_pool_impl.hpp"

namespace sdalloc {

using detail::Block;
using detail::PoolShard;
using vm_detail::range_of;
using vm_detail::VmRange;

// =======================================================================================
// backing one block

bool VirtualMemoryPool::Impl::back_pages(PoolShard& shard, Block* block, Level level,
                                         Attempt& attempt) {
  std::string& failure = attempt.failure;
  VmRange& range = range_of(block);
  const std::size_t page_size = range.page_size;
  const std::size_t first = range.first_page(block->addr);
  const std::size_t end = range.end_page(block->end());
  // Pages past the range's page table were never mapped: counted, not visited (a request
  // near the range's size would otherwise walk a million pages only to be refused).
  const std::size_t table_end = range.mapped_scan_end(end);
  std::size_t missing = end - std::max(first, table_end);  // table_end <= end
  for (std::size_t p = first; p < table_end; ++p) missing += range.is_mapped(p) ? 0 : 1;
  if (missing == 0) return true;
  if (const std::size_t ceiling = physical_ceiling();
      ceiling != 0 && missing > ceiling / page_size) {
    // More pages than can ever exist: no later level helps, and creating chunks one by one
    // until the system refuses would take minutes for a request of a terabyte.
    attempt = {std::to_string(missing) + " more pages of " + format_bytes(page_size) + " (" +
                   format_bytes(missing * page_size) + ") exceed the " + format_bytes(ceiling) +
                   " of physical memory that can ever exist",
               true};
    return false;
  }
  if (range.pages.size() < end) {
    // Doubling keeps growth rare; never past the range's own page count.
    range.pages.resize(
        std::min(std::max(end, range.pages.size() * 2), range.size / range.page_size));
  }

  Gathered got;  // chunks in hand; whatever is not mapped goes back on any exit
  try {
    gather(shard, missing, block->size, level, got, failure);
    if (got.size() < missing) {
      attempt.short_pages = missing - got.size();
      keep_in_place(got);
      give_back(got);
      return false;
    }
    order_for_mapping(got);
    map_pages(shard, range, first, end, got);
  } catch (...) {
    keep_in_place(got);
    give_back(got);
    throw;
  }
  return true;
}

void VirtualMemoryPool::Impl::gather(PoolShard& shard, std::size_t missing,
                                     std::size_t request_bytes, Level level, Gathered& got,
                                     std::string& failure) {
  const std::size_t page_size = options.page_size;
  take_spares(missing, got.reused);
  if (got.size() == missing) return;
  // Free pages of this shard first, unless the policy grows freely: below the cap
  // without remap_before_growth, or within growth_slack of the peak live bytes.
  const bool grow_freely = !options.remap_before_growth ||
                           within_growth_slack((missing - got.size()) * page_size, request_bytes);
  const bool remap_first = !grow_freely || level == Level::kOutOfMemory;
  // Free pages: this shard's, then (beyond kOwn, where they can move) other shards' that
  // can be locked at once.
  const bool moves = memory.can_move();
  const auto take_free_pages = [&] {
    steal_pages(shard, missing - got.size(), got.reused, moves ? &got.moving : nullptr);
    if (moves && level != Level::kOwn && got.size() < missing) {
      steal_to_move(shard, missing - got.size(), got);
    }
  };
  if (remap_first) take_free_pages();
  if (got.size() == missing) return;
  // Other shards may hold free pages too: level kOthers takes them before creating.
  const bool may_create = grow_freely || level != Level::kOwn || shards().size() == 1;
  if (may_create) {
    create_chunks(missing - got.size(), got.created, failure);
    got.created_now = got.created;
    std::sort(got.created_now.begin(), got.created_now.end());
  }
  if (got.size() == missing) return;
  if (!remap_first) take_free_pages();
  if (got.size() < missing && failure.empty()) {
    failure = "no physical chunk available for " + std::to_string(missing - got.size()) +
              " more pages of " + format_bytes(page_size);
  }
}

// Whether `bytes` more chunks keep the physical bytes within growth_slack of the highest
// live bytes seen: then creating is cheaper than moving pages (no unmap, and no page
// faults on pages that were in use elsewhere), and the footprint stays near the minimum.
// The live bytes are summed over the streams at this moment (exact, unlike a sum of the
// streams' peaks), plus the request; the highest such sum is kept.
bool VirtualMemoryPool::Impl::within_growth_slack(std::size_t bytes, std::size_t request_bytes) {
  if (options.growth_slack <= 0.0) return false;
  std::size_t live = request_bytes;
  {
    std::lock_guard lock(registry_mutex());
    for (PoolShard* shard : shards()) {
      live += vm_detail::vm_shard(*shard).live.load(std::memory_order_relaxed);
    }
    if (live > slow_path_peak_live) slow_path_peak_live = live;
    live = slow_path_peak_live;
  }
  const double allowed = static_cast<double>(live) * (1.0 + options.growth_slack);
  return static_cast<double>(counters.physical.current() + bytes) <= allowed;
}

// =======================================================================================
// mapping and unmapping

// Maps the gathered chunks under the unmapped pages in [first, end). On a failure the
// pages mapped here are unmapped again (their chunks return to `got`) and the error
// propagates.
void VirtualMemoryPool::Impl::map_pages(PoolShard& shard, VmRange& range, std::size_t first,
                                        std::size_t end, Gathered& got) {
  std::vector<std::size_t> mapped_here;
  mapped_here.reserve(got.size());
  try {
    // Each run of unmapped pages in one call where the memory can (the host: one mmap for
    // all of them), else page by page.
    const bool runs = memory.maps_runs();
    std::vector<std::uint32_t> taken;
    std::vector<PhysicalChunk> run;
    for (std::size_t p = move_pages(range, first, end, got, mapped_here); p < end;) {
      if (range.is_mapped(p)) {
        ++p;
        continue;
      }
      taken.clear();
      run.clear();
      for (std::size_t q = p; q < end && !range.is_mapped(q) && (runs || q == p); ++q) {
        taken.push_back(got.take());
        run.push_back(chunk_at(taken.back()));
      }
      try {
        void* address = reinterpret_cast<void*>(range.page_address(p));
        if (runs) {
          memory.map_run(address, run.data(), run.size());
        } else {
          memory.map(address, run.front());
        }
      } catch (...) {
        while (!taken.empty()) {  // the last taken goes back first: got's order is kept
          got.put_back(taken.back());
          taken.pop_back();
        }
        throw;
      }
      for (const std::uint32_t chunk : taken) {
        range.pages[p] = chunk + 1;
        ++range.mapped_pages;
        mapped_here.push_back(p++);
      }
      counters.maps.fetch_add(taken.size(), std::memory_order_relaxed);
      counters.mapped.add(taken.size() * range.page_size);
    }
  } catch (...) {
    // Roll back: the request fails as if it had never been made. A page that cannot be
    // unmapped (the system refused: Linux at its mapping limit) stays mapped under what is
    // free space again, its chunk held by the range, and the map's error is what goes on.
    while (!mapped_here.empty()) {  // last mapped first
      try {
        got.put_back(unmap_page(range, mapped_here.back(), shard.stream));
      } catch (...) {  // NOLINT(bugprone-empty-catch): kept mapped, see above
      }
      mapped_here.pop_back();
    }
    rethrow_map_failure();
  }
}

void VirtualMemoryPool::Impl::steal_to_move(PoolShard& requester, std::size_t want, Gathered& got) {
  for (PoolShard* other : shards()) {
    if (want == 0) break;
    if (other == &requester) continue;
    std::unique_lock lock(other->mutex, std::try_to_lock);
    if (!lock.owns_lock() || !events.idle(other->stream)) continue;
    // Held before a page is taken: pages in got.moving are put back under their lock,
    // also when stealing fails halfway.
    got.held.push_back(std::move(lock));
    const std::size_t taken = steal_pages(*other, want, got.reused, &got.moving);
    if (taken == 0) got.held.pop_back();
    want -= taken;
  }
}

std::size_t VirtualMemoryPool::Impl::move_pages(VmRange& range, std::size_t p, std::size_t end,
                                                Gathered& got,
                                                std::vector<std::size_t>& mapped_here) {
  std::vector<Gathered::Moving>& moving = got.moving;
  std::size_t done = 0;  // moved from the front of `moving`
  std::vector<PhysicalChunk> run;
  try {
    while (p < end && done < moving.size()) {
      if (range.is_mapped(p)) {
        ++p;
        continue;
      }
      // A run: unmapped pages here from p on, and the next pages to move, neighbours in
      // one range with chunks whose handles follow each other (one kernel mapping where
      // the memory is the host's).
      const Gathered::Moving& head = moving[done];
      run.clear();
      for (std::size_t k = 0; p + k < end && done + k < moving.size() && !range.is_mapped(p + k);
           ++k) {
        const Gathered::Moving& next = moving[done + k];
        const PhysicalChunk chunk = chunk_at(next.chunk);
        if (k != 0 && (next.range != head.range || next.page != head.page + k ||
                       chunk.handle != run.back().handle + run.back().bytes)) {
          break;
        }
        run.push_back(chunk);
      }
      memory.move(reinterpret_cast<void*>(head.range->page_address(head.page)),
                  reinterpret_cast<void*>(range.page_address(p)), run.data(), run.size(),
                  head.last_use);
      counters.moves.fetch_add(1, std::memory_order_relaxed);
      counters.remapped_pages.fetch_add(run.size(), std::memory_order_relaxed);
      for (std::size_t k = 0; k < run.size(); ++k, ++p) {
        range.pages[p] = moving[done + k].chunk + 1;
        ++range.mapped_pages;
        mapped_here.push_back(p);
      }
      done += run.size();
    }
  } catch (...) {
    moving.erase(moving.begin(), moving.begin() + static_cast<std::ptrdiff_t>(done));
    throw;
  }
  moving.erase(moving.begin(), moving.begin() + static_cast<std::ptrdiff_t>(done));
  return p;
}

void VirtualMemoryPool::Impl::keep_in_place(Gathered& got) {
  for (const Gathered::Moving& m : got.moving) {
    m.range->pages[m.page] = m.chunk + 1;
    ++m.range->mapped_pages;
  }
  got.moving.clear();
}

// Called inside a catch block: an OutOfMemory goes on as it is (try_allocate reports it);
// any other error is named.
void VirtualMemoryPool::Impl::rethrow_map_failure() const {
  try {
    throw;
  } catch (const OutOfMemory&) {
    throw;
  } catch (const Error& e) {
    throw Error(name() + ": mapping a page of " + format_bytes(options.page_size) +
                " failed (the request was rolled back): " + e.what());
  }
}

// Unmaps one page and answers its chunk (now held, unmapped). The caller holds the
// range's shard lock.
std::uint32_t VirtualMemoryPool::Impl::unmap_page(VmRange& range, std::size_t page,
                                                  Stream last_use) {
  const std::uint32_t chunk = range.pages[page] - 1;
  memory.unmap(reinterpret_cast<void*>(range.page_address(page)), range.page_size, last_use);
  range.pages[page] = 0;
  --range.mapped_pages;
  counters.unmaps.fetch_add(1, std::memory_order_relaxed);
  counters.mapped.sub(range.page_size);
  return chunk;
}

void VirtualMemoryPool::Impl::recycle_block(PoolShard& shard, Block* block) {
  if (!options.eager_unmap) {
    shard.release(block);
    return;
  }
  // Eager: merge now and unmap the pages no allocation uses any more.
  Block* merged = block->prev != nullptr && block->prev->indexed ? block->prev : block;
  shard.make_free(block);
  VmRange& range = range_of(merged);
  // The block is free already, so nothing here may fail the free: a page whose unmap fails
  // stays mapped under free space (the invariant allows it) and is counted; the chunks
  // unmapped before it go to the spares as usual.
  const std::size_t first = range.end_page(merged->addr);
  const std::size_t end = range.mapped_scan_end(range.first_page(merged->end()));
  std::vector<std::uint32_t> freed;
  try {
    freed.reserve(end > first ? end - first : 0);
    for (std::size_t p = first; p < end; ++p) {
      if (range.is_mapped(p)) freed.push_back(unmap_page(range, p, shard.stream));
    }
  } catch (...) {
    counters.failed_unmaps.fetch_add(1, std::memory_order_relaxed);
  }
  try {
    give_back_reused(freed);
  } catch (...) {
    // Only destroy_spare_chunks' destroys can fail here: those chunks stay spare.
    counters.failed_unmaps.fetch_add(1, std::memory_order_relaxed);
  }
}

// =======================================================================================
// moving free pages

// Unmaps up to `want` pages of `shard` that lie wholly inside free blocks and adds their
// chunks to `out`: the largest free blocks first, and in each block its highest pages
// first. Best fit carves a request from the low end of the smallest free block that fits,
// so in a loop the pages at the top of the largest free blocks (the tail of the range
// above the working set) are the ones reached last: moving them leaves in place the pages
// the next requests will land on. (Smallest blocks first, lowest pages first, moved several
// times as many pages: docs/notebook/virtual_memory_pool.md, "Which pages move".)
// The caller holds shard.mutex.
std::size_t VirtualMemoryPool::Impl::steal_pages(PoolShard& shard, std::size_t want,
                                                 std::vector<std::uint32_t>& out,
                                                 std::vector<Gathered::Moving>* defer) {
  if (want == 0) return 0;
  const std::size_t page_size = options.page_size;
  shard.drain_quick_lists();
  std::size_t taken = 0;
  for (Block* b = shard.normal.largest(); b != nullptr && b->size >= page_size && taken < want;
       b = shard.normal.predecessor(b)) {
    VmRange& range = range_of(b);
    const std::size_t first = range.end_page(b->addr);  // first page starting inside b
    // pages ending inside b (none mapped beyond the range's page table)
    const std::size_t end = range.mapped_scan_end(range.first_page(b->end()));
    for (std::size_t p = end; p > first && taken < want; --p) {
      if (!range.is_mapped(p - 1)) continue;
      if (defer != nullptr) {
        defer->push_back({&range, p - 1, range.pages[p - 1] - 1, shard.stream});  // may throw
        range.pages[p - 1] = 0;
        --range.mapped_pages;
      } else {
        out.push_back(unmap_page(range, p - 1, shard.stream));
      }
      ++taken;
    }
  }
  // Deferred pages count when they move (move_pages).
  if (defer == nullptr) counters.remapped_pages.fetch_add(taken, std::memory_order_relaxed);
  return taken;
}

// Moves up to `want` free pages of other shards into the spares.
// Without `wait` only idle streams give up pages; with it, pending frees are waited for and
// every stream's pages may go (unmap waits for the stream's work).
void VirtualMemoryPool::Impl::steal_from_other_shards(PoolShard& requester, std::size_t want,
                                                      bool wait) {
  for (PoolShard* other : shards()) {
    if (want == 0) break;
    std::vector<std::uint32_t> stolen;
    {
      std::lock_guard lock(other->mutex);
      if (wait && !other->pending.empty()) other->collect_pending(events, true);
      if (other == &requester) continue;  // its own pages: taken under its lock later
      if (!wait && !events.idle(other->stream)) continue;
      try {
        want -= steal_pages(*other, want, stolen);
      } catch (...) {
        give_back_reused(stolen);
        throw;
      }
    }
    give_back_reused(stolen);
  }
}

}  // namespace sdalloc
