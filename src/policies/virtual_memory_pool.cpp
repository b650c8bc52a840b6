// virtual_memory_pool.cpp - VirtualMemoryPool: ranges per stream and class, pages on demand.
//
// Each (stream, class) has a PoolShard (src/pool/pool_shard.hpp) whose "segments" are reserved
// address ranges (VmRange below, a Segment with a page table). Blocks, best fit, quick lists
// and the live table are the shard's, unchanged; this file adds what virtual memory needs:
//
//   page table   per range, one entry per page: the index of the chunk mapped there + 1,
//                or 0. Guarded by the owning shard's lock.
//   chunks       pool-wide table of chunks (index -> PhysicalChunk) and the spare lists
//                (chunks held but unmapped), guarded by chunk_mutex. Taken only on the slow
//                path, never while another shard's lock is held.
//
// Invariant: every page that overlaps a block that is not in a free index (live, parked in
// a quick list, pending a cross-stream free, or being carved) is mapped. So a quick-list hit
// needs no page check at all, and a best fit only checks the pages of the block it chose.
//
// Slow path (allocate_slow): carve a block, count its unmapped pages, and gather chunks in
// levels, retrying after each: (0) spares, pages of this shard's own free space, new chunks
// when the policy allows; (1) free pages of other idle shards with the same page size, then
// new chunks; (2, out of memory) wait for pending frees and busy streams, take free pages
// from every shard. A level that cannot cover the block puts it back first, so no shard lock
// is held while another is taken.

#include "sdalloc/policies/virtual_memory_pool.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "pool/block.hpp"
#include "pool/pool_counters.hpp"
#include "pool/pool_shard.hpp"
#include "sdalloc/core/errors.hpp"
#include "core/bits.hpp"

namespace sdalloc {

using detail::Block;
using detail::Fit;
using detail::Gauge;
using detail::PoolShard;
using detail::Segment;

namespace {



std::string pointer_text(const void* ptr) {
  char text[32];
  std::snprintf(text, sizeof text, "%p", ptr);
  return text;
}

constexpr std::size_t kDefaultPageSize = std::size_t{64} << 10;

// A reserved address range: a Segment of its shard, plus which chunk backs each page.
struct VmRange : Segment {
  std::size_t page_size = 0;
  std::vector<std::uint32_t> pages;  // chunk index + 1, or 0: unmapped; grows on demand
  std::size_t mapped_pages = 0;

  bool is_mapped(std::size_t page) const { return page < pages.size() && pages[page] != 0; }
  std::uintptr_t page_address(std::size_t page) const { return base + page * page_size; }
  std::size_t first_page(std::uintptr_t addr) const { return (addr - base) / page_size; }
  // One past the last page that [addr, end) overlaps.
  std::size_t end_page(std::uintptr_t end) const {
    return (end - base + page_size - 1) / page_size;
  }
};

VmRange& range_of(const Block* block) { return *static_cast<VmRange*>(block->segment); }

}  // namespace

void VirtualMemoryPoolOptions::validate(std::size_t granularity) const {
  auto fail = [](const std::string& what) {
    throw InvalidArgument("VirtualMemoryPoolOptions: " + what);
  };
  for (auto [field, value] : {std::pair{"large_page_size", large_page_size},
                              std::pair{"small_page_size", small_page_size}}) {
    if (value != 0 && (value % granularity != 0 || !is_power_of_two(value))) {
      fail(std::string(field) + " must be 0 or a power-of-two multiple of the granularity (" +
           std::to_string(granularity) + "), got " + std::to_string(value));
    }
  }
  if (!(growth_slack >= 0.0 && growth_slack <= 1.0)) {
    fail("growth_slack must be between 0 and 1, got " + std::to_string(growth_slack));
  }
  if (range_size == 0 || range_size % granularity != 0) {
    fail("range_size must be a positive multiple of the granularity (" +
         std::to_string(granularity) + "), got " + std::to_string(range_size));
  }
}

// =======================================================================================
// Impl

struct VirtualMemoryPool::Impl {
  Impl(VirtualMemory& vm, VirtualMemoryPoolOptions opts)
      : memory(vm),
        options(opts),
        events(opts.stream_events != nullptr ? *opts.stream_events
                                             : HostStreamEvents::instance()) {
    const std::size_t granularity = memory.granularity();
    if (!is_power_of_two(granularity)) {
      throw InvalidArgument(memory.name() + ": granularity " + std::to_string(granularity) +
                            " is not a power of two");
    }
    options.validate(granularity);
    if (options.large_page_size == 0) {
      options.large_page_size = std::max(granularity, kDefaultPageSize);
    }
    if (options.small_page_size == 0) {
      options.small_page_size = std::max(granularity, kDefaultPageSize);
    }
    options.range_size = round_up(options.range_size,
                                  std::max(options.large_page_size, options.small_page_size));
    tables.push_back(std::make_unique<ShardTable>());
    table.store(tables.back().get(), std::memory_order_release);
  }

  // --- shard registry (as CachingPool's: tables are published, never changed) ----------
  struct ShardKey {
    Stream stream;
    bool small = false;
    friend bool operator==(const ShardKey&, const ShardKey&) = default;
  };
  // Live bytes of one stream, shared by its two class shards: pool-wide peaks must be exact
  // (the bars compare peak mapped with peak live), and a stream's two shards have two locks.
  // Own cache line: threads on other streams never write it.
  struct alignas(64) StreamLive {
    Stream stream;
    Gauge bytes;
  };
  struct ShardRef {
    PoolShard* shard = nullptr;
    StreamLive* live = nullptr;
  };
  struct ShardTable {
    std::vector<ShardKey> keys;
    std::vector<ShardRef> refs;
    std::vector<PoolShard*> shards;
  };

  ShardRef shard_for(Stream stream, bool small) {
    const ShardKey key{stream, small};
    const ShardTable* t = table.load(std::memory_order_acquire);
    for (std::size_t i = 0; i < t->keys.size(); ++i) {
      if (t->keys[i] == key) return t->refs[i];
    }
    return add_shard(key);
  }

  ShardRef add_shard(const ShardKey& key) {
    std::lock_guard lock(registry_mutex);
    const ShardTable* t = table.load(std::memory_order_acquire);
    for (std::size_t i = 0; i < t->keys.size(); ++i) {
      if (t->keys[i] == key) return t->refs[i];
    }
    StreamLive* live = nullptr;
    for (const auto& candidate : stream_live) {
      if (candidate->stream == key.stream) live = candidate.get();
    }
    if (live == nullptr) {
      stream_live.push_back(std::make_unique<StreamLive>());
      live = stream_live.back().get();
      live->stream = key.stream;
    }
    owned_shards.push_back(std::make_unique<PoolShard>(key.stream));
    page_sizes.push_back(key.small ? options.small_page_size : options.large_page_size);
    auto next = std::make_unique<ShardTable>(*t);
    next->keys.push_back(key);
    next->refs.push_back(ShardRef{owned_shards.back().get(), live});
    next->shards.push_back(owned_shards.back().get());
    table.store(next.get(), std::memory_order_release);
    tables.push_back(std::move(next));
    return tables.back()->refs.back();
  }

  std::vector<PoolShard*> all_shards() const {
    return table.load(std::memory_order_acquire)->shards;
  }

  // The live-bytes gauge of the stream that owns `shard`.
  StreamLive& live_of(const PoolShard& shard) const {
    const ShardTable* t = table.load(std::memory_order_acquire);
    for (const ShardRef& ref : t->refs) {
      if (ref.shard == &shard) return *ref.live;
    }
    throw Error("VirtualMemoryPool: a shard without a stream");  // cannot happen
  }

  std::size_t page_size_of(bool small) const {
    return small ? options.small_page_size : options.large_page_size;
  }

  // --- requests ---------------------------------------------------------------------------
  Fit fit_for(std::size_t bytes, std::size_t alignment) const {
    Fit fit;
    fit.rounded = round_up(bytes, kRounding);
    fit.alignment = std::max(alignment, kRounding);
    fit.needed = fit.rounded + (fit.alignment - kRounding);
    fit.huge = false;  // address space is plentiful: no block is set aside for huge requests
    return fit;
  }

  void check_request(std::size_t bytes, std::size_t alignment) const {
    if (!is_power_of_two(alignment) || alignment > kMaxAlignment) {
      throw InvalidArgument(name() + ": alignment must be a power of two no larger than " +
                            std::to_string(kMaxAlignment) + ", got " +
                            std::to_string(alignment));
    }
    if (bytes > kMaxAllocation) {
      counters.ooms.fetch_add(1, std::memory_order_relaxed);
      throw OutOfMemory::describe(name(), oom_info(bytes),
                                  "larger than the largest allocation sdalloc manages (" +
                                      format_bytes(kMaxAllocation) + ")");
    }
  }

  static bool pages_mapped(const Block* block) {
    const VmRange& range = range_of(block);
    const std::size_t end = range.end_page(block->end());
    for (std::size_t p = range.first_page(block->addr); p < end; ++p) {
      if (!range.is_mapped(p)) return false;
    }
    return true;
  }

  // The fast path: a quick-list hit (its pages are mapped by the invariant), or a best fit
  // whose pages are all mapped. Anything else goes to allocate_slow.
  void* allocate(std::size_t bytes, std::size_t alignment, Stream stream) {
    check_request(bytes, alignment);
    if (bytes == 0) return nullptr;
    const Fit fit = fit_for(bytes, alignment);
    const bool small = fit.needed <= options.small_limit;
    const ShardRef ref = shard_for(stream, small);
    PoolShard& shard = *ref.shard;
    {
      std::lock_guard lock(shard.mutex);
      if (fit.alignment == kRounding) {
        shard.live.reserve_one();
        if (Block* block = shard.quick.pop(fit.rounded)) {
          ref.live->bytes.add(bytes);
          return shard.make_live(block, bytes)->ptr();
        }
      }
      shard.drain_quick_lists();
      if (Block* found = shard.find(fit); found != nullptr && pages_mapped_for(found, fit)) {
        ref.live->bytes.add(bytes);
        return shard.allocate_from(found, fit, bytes)->ptr();
      }
    }
    void* ptr = allocate_slow(shard, small, fit, bytes);
    ref.live->bytes.add(bytes);
    return ptr;
  }

  // Whether the part of free block `found` that carve() would hand out is mapped.
  static bool pages_mapped_for(const Block* found, const Fit& fit) {
    const VmRange& range = range_of(found);
    const std::uintptr_t start =
        (found->addr + fit.alignment - 1) & ~(static_cast<std::uintptr_t>(fit.alignment) - 1);
    const std::size_t end = range.end_page(start + fit.rounded);
    for (std::size_t p = range.first_page(start); p < end; ++p) {
      if (!range.is_mapped(p)) return false;
    }
    return true;
  }

  // --- the slow path ---------------------------------------------------------------------
  enum class Level { kOwn, kOthers, kOutOfMemory };

  void* allocate_slow(PoolShard& shard, bool small, const Fit& fit, std::size_t bytes) {
    const std::size_t page_size = page_size_of(small);
    Attempt attempt;  // why the last level could not cover the block
    for (Level level : {Level::kOwn, Level::kOthers, Level::kOutOfMemory}) {
      if (attempt.final) break;
      if (level == Level::kOthers) {
        // As many pages as the request can touch; other streams keep the rest.
        steal_from_other_shards(shard, page_size, fit.needed / page_size + 2, /*wait=*/false);
      } else if (level == Level::kOutOfMemory) {
        counters.oom_retries.fetch_add(1, std::memory_order_relaxed);
        steal_from_other_shards(shard, page_size, SIZE_MAX, /*wait=*/true);
      }
      std::lock_guard lock(shard.mutex);
      if (level == Level::kOutOfMemory && !shard.pending.empty()) {
        shard.collect_pending(events, /*wait=*/true);
      }
      if (void* ptr = try_allocate(shard, fit, bytes, level, attempt)) return ptr;
    }
    // Out of every lock: oom_info takes them in turn.
    counters.ooms.fetch_add(1, std::memory_order_relaxed);
    throw OutOfMemory::describe(name(), oom_info(bytes), oom_detail(attempt.failure));
  }

  // How an attempt ended without memory: why, and whether a later level could help (a
  // refused reservation or mapping will not be different after moving pages).
  struct Attempt {
    std::string failure;
    bool final = false;
  };

  // One attempt under the shard's lock: carve a block (reserving a new range if no free
  // block fits), back its unmapped pages with chunks, make it live. Answers nullptr, with
  // `failure` saying why, when the chunks could not all be had at this level; the block then
  // goes back and nothing else changed. Errors other than a lack of memory propagate, also
  // with nothing changed.
  void* try_allocate(PoolShard& shard, const Fit& fit, std::size_t bytes, Level level,
                     Attempt& attempt) {
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
    shard.records.reserve(2);
    shard.live.reserve_one();
    Block* block = shard.carve(found, fit);
    block->free = false;  // not indexed, not live: the neighbours will not merge into it
    try {
      if (!back_pages(shard, block, level, attempt.failure)) {
        shard.make_free(block);
        return nullptr;
      }
    } catch (const OutOfMemory& e) {  // only map() lets one through
      shard.make_free(block);
      attempt = {std::string("mapping a page failed (the request was rolled back): ") + e.what(),
                 true};
      return nullptr;
    } catch (...) {
      shard.make_free(block);
      throw;
    }
    return shard.make_live(block, bytes)->ptr();
  }

  // Reserves a new range for `shard`, big enough for `fit`, and answers its one free block.
  Block* add_range(PoolShard& shard, const Fit& fit) {
    const bool small = fit.needed <= options.small_limit;
    const std::size_t page_size = page_size_of(small);
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

  // Maps a chunk under every unmapped page of `block` (held by the caller, not yet live).
  // Chunks come from the spares, from free pages of this shard, and from the VirtualMemory,
  // in the order the policy and `level` allow. Answers false (having undone everything) when
  // not enough chunks can be had.
  bool back_pages(PoolShard& shard, Block* block, Level level, std::string& failure) {
    VmRange& range = range_of(block);
    const std::size_t page_size = range.page_size;
    const std::size_t first = range.first_page(block->addr);
    const std::size_t end = range.end_page(block->end());
    std::size_t missing = 0;
    for (std::size_t p = first; p < end; ++p) missing += range.is_mapped(p) ? 0 : 1;
    if (missing == 0) return true;
    if (range.pages.size() < end) {
      // Doubling keeps growth rare; never past the range's own page count.
      range.pages.resize(std::min(std::max(end, range.pages.size() * 2),
                                  range.size / range.page_size));
    }

    Gathered got;  // chunks in hand; whatever is not mapped goes back on any exit
    try {
      gather(shard, page_size, missing, block->size, level, got, failure);
      if (got.size() < missing) {
        give_back(got, page_size);
        return false;
      }
      map_pages(shard, range, first, end, got);
    } catch (...) {
      give_back(got, page_size);
      throw;
    }
    return true;
  }

  // Chunks in hand during one attempt: those taken from spares or moved from free pages
  // (which go back to the spares if unused) and those created now (destroyed if unused, so
  // a failed request leaves the physical footprint as it was).
  struct Gathered {
    std::vector<std::uint32_t> reused;
    std::vector<std::uint32_t> created;
    std::vector<std::uint32_t> created_now;  // every chunk created in this attempt, sorted
    std::size_t size() const { return reused.size() + created.size(); }
    std::uint32_t take() {
      std::vector<std::uint32_t>& from = reused.empty() ? created : reused;
      const std::uint32_t chunk = from.back();
      from.pop_back();
      return chunk;
    }
    // A chunk taken but not kept goes back to the list it came from.
    void put_back(std::uint32_t chunk) {
      const bool fresh = std::binary_search(created_now.begin(), created_now.end(), chunk);
      (fresh ? created : reused).push_back(chunk);
    }
  };

  void gather(PoolShard& shard, std::size_t page_size, std::size_t missing,
              std::size_t request_bytes, Level level, Gathered& got, std::string& failure) {
    take_spares(page_size, missing, got.reused);
    if (got.size() == missing) return;
    // Free pages of this shard first, unless the policy grows freely: below the cap
    // without remap_before_growth, or within growth_slack of the peak live bytes.
    const bool grow_freely =
        !options.remap_before_growth ||
        within_growth_slack((missing - got.size()) * page_size, request_bytes);
    const bool remap_first = !grow_freely || level == Level::kOutOfMemory;
    if (remap_first) steal_pages(shard, page_size, missing - got.size(), got.reused);
    if (got.size() == missing) return;
    // Other shards may hold free pages too: level kOthers takes them before creating.
    const bool may_create =
        grow_freely || level != Level::kOwn || !other_shards_with(page_size, shard);
    if (may_create) {
      create_chunks(page_size, missing - got.size(), got.created, failure);
      got.created_now = got.created;
      std::sort(got.created_now.begin(), got.created_now.end());
    }
    if (got.size() == missing) return;
    if (!remap_first) steal_pages(shard, page_size, missing - got.size(), got.reused);
    if (got.size() < missing && failure.empty()) {
      failure = "no physical chunk available for " +
                std::to_string(missing - got.size()) + " more pages of " +
                format_bytes(page_size);
    }
  }

  // Whether `bytes` more chunks keep the physical bytes within growth_slack of the highest
  // live bytes seen: then creating is cheaper than moving pages (no unmap, and no page
  // faults on pages that were in use elsewhere), and the footprint stays near the minimum.
  // The live bytes are summed over the streams at this moment (exact, unlike a sum of the
  // streams' peaks), plus the request; the highest such sum is kept.
  bool within_growth_slack(std::size_t bytes, std::size_t request_bytes) {
    if (options.growth_slack <= 0.0) return false;
    std::size_t live = request_bytes;
    {
      std::lock_guard lock(registry_mutex);
      for (const auto& stream : stream_live) live += stream->bytes.current();
      if (live > slow_path_peak_live) slow_path_peak_live = live;
      live = slow_path_peak_live;
    }
    const double allowed = static_cast<double>(live) * (1.0 + options.growth_slack);
    return static_cast<double>(counters.physical.current() + bytes) <= allowed;
  }

  bool other_shards_with(std::size_t page_size, const PoolShard& shard) const {
    const ShardTable* t = table.load(std::memory_order_acquire);
    for (std::size_t i = 0; i < t->shards.size(); ++i) {
      if (t->shards[i] != &shard && page_size_at(i) == page_size) return true;
    }
    return false;
  }

  std::size_t page_size_at(std::size_t shard_index) const {
    std::lock_guard lock(registry_mutex);
    return page_sizes[shard_index];
  }

  // Maps the gathered chunks under the unmapped pages in [first, end). On a failure the
  // pages mapped here are unmapped again (their chunks return to `got`) and the error
  // propagates.
  void map_pages(PoolShard& shard, VmRange& range, std::size_t first, std::size_t end,
                 Gathered& got) {
    std::vector<std::size_t> mapped_here;
    mapped_here.reserve(got.size());
    try {
      for (std::size_t p = first; p < end; ++p) {
        if (range.is_mapped(p)) continue;
        const std::uint32_t chunk = got.take();
        try {
          memory.map(reinterpret_cast<void*>(range.page_address(p)), chunk_at(chunk));
        } catch (...) {
          got.put_back(chunk);
          throw;
        }
        range.pages[p] = chunk + 1;
        ++range.mapped_pages;
        mapped_here.push_back(p);
        counters.maps.fetch_add(1, std::memory_order_relaxed);
        counters.mapped.add(range.page_size);
      }
    } catch (...) {
      // Roll back: the request fails as if it had never been made.
      while (!mapped_here.empty()) {  // last mapped first
        got.put_back(unmap_page(range, mapped_here.back(), shard.stream));
        mapped_here.pop_back();
      }
      rethrow_map_failure(range.page_size);
    }
  }

  // Called inside a catch block: an OutOfMemory goes on as it is (try_allocate reports it);
  // any other error is named.
  [[noreturn]] void rethrow_map_failure(std::size_t page_size) const {
    try {
      throw;
    } catch (const OutOfMemory&) {
      throw;
    } catch (const Error& e) {
      throw Error(name() + ": mapping a page of " + format_bytes(page_size) +
                  " failed (the request was rolled back): " + e.what());
    }
  }

  // Unmaps one page and answers its chunk (now held, unmapped). The caller holds the
  // range's shard lock.
  std::uint32_t unmap_page(VmRange& range, std::size_t page, Stream last_use) {
    const std::uint32_t chunk = range.pages[page] - 1;
    memory.unmap(reinterpret_cast<void*>(range.page_address(page)), range.page_size, last_use);
    range.pages[page] = 0;
    --range.mapped_pages;
    counters.unmaps.fetch_add(1, std::memory_order_relaxed);
    counters.mapped.sub(range.page_size);
    return chunk;
  }

  // Unmaps up to `want` pages of `shard` that lie wholly inside free blocks, smallest free
  // blocks first (a big free block keeps its pages for a big request), and adds their
  // chunks to `out`. The caller holds shard.mutex.
  std::size_t steal_pages(PoolShard& shard, std::size_t page_size, std::size_t want,
                          std::vector<std::uint32_t>& out) {
    if (want == 0) return 0;
    shard.drain_quick_lists();
    std::size_t taken = 0;
    for (Block* b = shard.normal.best_fit(page_size); b != nullptr && taken < want;
         b = shard.normal.successor(b)) {
      VmRange& range = range_of(b);  // every range of a shard has `page_size` pages
      const std::size_t first = range.end_page(b->addr);  // first page starting inside b
      const std::size_t end = range.first_page(b->end());  // pages ending inside b
      for (std::size_t p = first; p < end && taken < want; ++p) {
        if (!range.is_mapped(p)) continue;
        out.push_back(unmap_page(range, p, shard.stream));
        ++taken;
      }
    }
    counters.remapped_pages.fetch_add(taken, std::memory_order_relaxed);
    return taken;
  }

  // Moves up to `want` free pages of other shards with the same page size into the spares.
  // Without
  // `wait` only idle streams give up pages; with it, pending frees are waited for and every
  // stream's pages may go (unmap waits for the stream's work).
  void steal_from_other_shards(PoolShard& requester, std::size_t page_size, std::size_t want,
                               bool wait) {
    const ShardTable* t = table.load(std::memory_order_acquire);
    for (std::size_t i = 0; i < t->shards.size() && want > 0; ++i) {
      PoolShard* other = t->shards[i];
      if (page_size_at(i) != page_size) continue;
      std::vector<std::uint32_t> stolen;
      {
        std::lock_guard lock(other->mutex);
        if (wait && !other->pending.empty()) other->collect_pending(events, true);
        if (other == &requester) continue;  // its own pages: taken under its lock later
        if (!wait && !events.idle(other->stream)) continue;
        try {
          want -= steal_pages(*other, page_size, want, stolen);
        } catch (...) {
          give_back_reused(stolen, page_size);
          throw;
        }
      }
      give_back_reused(stolen, page_size);
    }
  }

  // --- chunks -----------------------------------------------------------------------------
  PhysicalChunk chunk_at(std::uint32_t index) const {
    std::lock_guard lock(chunk_mutex);
    return chunks[index];
  }

  std::vector<std::uint32_t>& spares_for(std::size_t page_size) {
    return page_size == options.small_page_size ? small_spares : large_spares;
  }

  void take_spares(std::size_t page_size, std::size_t want, std::vector<std::uint32_t>& out) {
    std::lock_guard lock(chunk_mutex);
    std::vector<std::uint32_t>& spares = spares_for(page_size);
    while (!spares.empty() && out.size() < want) {
      out.push_back(spares.back());
      spares.pop_back();
    }
  }

  void give_back_reused(std::vector<std::uint32_t>& reused, std::size_t page_size) {
    if (reused.empty()) return;
    {
      std::lock_guard lock(chunk_mutex);
      std::vector<std::uint32_t>& spares = spares_for(page_size);
      spares.insert(spares.end(), reused.begin(), reused.end());
    }
    reused.clear();
    if (options.destroy_spare_chunks) destroy_spares();
  }

  void give_back(Gathered& got, std::size_t page_size) {
    give_back_reused(got.reused, page_size);
    for (std::uint32_t chunk : got.created) destroy_chunk(chunk);
    got.created.clear();
  }

  // Creates up to `want` chunks within the cap. Stops at the first refusal, noting why.
  void create_chunks(std::size_t page_size, std::size_t want, std::vector<std::uint32_t>& out,
                     std::string& failure) {
    for (std::size_t i = 0; i < want; ++i) {
      if (!commit(page_size)) {
        failure = "the physical cap of " + format_bytes(options.max_physical_bytes) +
                  " is reached";
        return;
      }
      PhysicalChunk chunk;
      try {
        chunk = memory.create(page_size);
      } catch (const OutOfMemory& e) {
        uncommit(page_size);
        failure = std::string("creating a chunk failed: ") + e.what();
        return;
      } catch (const Error& e) {
        uncommit(page_size);
        throw Error(name() + ": creating a chunk of " + format_bytes(page_size) +
                    " failed: " + e.what());
      }
      try {
        out.push_back(add_chunk(chunk));
      } catch (...) {
        memory.destroy(chunk);
        uncommit(page_size);
        throw;
      }
      counters.physical.add(page_size);
      counters.creates.fetch_add(1, std::memory_order_relaxed);
    }
  }

  // Claims `bytes` of the physical cap before a chunk is created, so that threads creating
  // at once never pass it together.
  bool commit(std::size_t bytes) {
    std::size_t used = committed.load(std::memory_order_relaxed);
    do {
      if (options.max_physical_bytes != 0 && bytes > options.max_physical_bytes - used) {
        return false;
      }
    } while (!committed.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
    return true;
  }
  void uncommit(std::size_t bytes) { committed.fetch_sub(bytes, std::memory_order_relaxed); }

  std::uint32_t add_chunk(PhysicalChunk chunk) {
    std::lock_guard lock(chunk_mutex);
    if (!free_chunk_slots.empty()) {
      const std::uint32_t index = free_chunk_slots.back();
      free_chunk_slots.pop_back();
      chunks[index] = chunk;
      return index;
    }
    free_chunk_slots.reserve(chunks.size() + 1);  // so destroy_chunk cannot fail to push
    chunks.push_back(chunk);
    return static_cast<std::uint32_t>(chunks.size() - 1);
  }

  void destroy_chunk(std::uint32_t index) {
    PhysicalChunk chunk;
    {
      std::lock_guard lock(chunk_mutex);
      chunk = chunks[index];
      chunks[index] = PhysicalChunk{};
      free_chunk_slots.push_back(index);
    }
    counters.physical.sub(chunk.bytes);
    counters.destroys.fetch_add(1, std::memory_order_relaxed);
    uncommit(chunk.bytes);
    memory.destroy(chunk);
  }

  std::size_t destroy_spares() {
    std::vector<std::uint32_t> doomed;
    {
      std::lock_guard lock(chunk_mutex);
      doomed.swap(small_spares);
      doomed.insert(doomed.end(), large_spares.begin(), large_spares.end());
      large_spares.clear();
    }
    std::size_t bytes = 0;
    for (std::uint32_t chunk : doomed) {
      bytes += chunk_at(chunk).bytes;
      destroy_chunk(chunk);
    }
    return bytes;
  }

  // --- free -------------------------------------------------------------------------------
  void free(void* ptr, Stream stream, const std::size_t* expected_bytes) {
    if (ptr == nullptr) return;
    const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
    // The class is not known from the pointer; try the stream's shards, small first.
    for (bool small : {true, false}) {
      const ShardRef ref = find_shard(stream, small);
      PoolShard* shard = ref.shard;
      if (shard == nullptr) continue;
      std::lock_guard lock(shard->mutex);
      Block* block = shard->find_live(addr);
      if (block == nullptr) continue;
      if (block->other_streams != nullptr) break;  // their work first: free_slow waits for it
      check_size(block, ptr, expected_bytes);
      ref.live->bytes.sub(block->requested);
      shard->forget_live(block);
      recycle(*shard, block);
      return;
    }
    free_slow(ptr, stream, expected_bytes);
  }

  ShardRef find_shard(Stream stream, bool small) const {
    const ShardKey key{stream, small};
    const ShardTable* t = table.load(std::memory_order_acquire);
    for (std::size_t i = 0; i < t->keys.size(); ++i) {
      if (t->keys[i] == key) return t->refs[i];
    }
    return {};
  }

  // Returns a forgotten block to its shard's free space (caller holds the shard's lock).
  void recycle(PoolShard& shard, Block* block) {
    if (!options.eager_unmap) {
      shard.release(block);
      return;
    }
    // Eager: merge now and unmap the pages no allocation uses any more.
    Block* merged = block->prev != nullptr && block->prev->indexed ? block->prev : block;
    shard.make_free(block);
    VmRange& range = range_of(merged);
    std::vector<std::uint32_t> freed;
    try {
      for (std::size_t p = range.end_page(merged->addr); p < range.first_page(merged->end());
           ++p) {
        if (range.is_mapped(p)) freed.push_back(unmap_page(range, p, shard.stream));
      }
    } catch (...) {
      give_back_reused(freed, range.page_size);
      throw;
    }
    give_back_reused(freed, range.page_size);
  }

  void check_size(const Block* block, const void* ptr, const std::size_t* expected) const {
    if (expected != nullptr && *expected != block->requested) {
      throw InvalidArgument(name() + ": deallocate of " + pointer_text(ptr) + " states " +
                            std::to_string(*expected) + " bytes, but it was allocated with " +
                            std::to_string(block->requested));
    }
  }

  // Allocated on another stream, used by other streams (record_stream), or not ours at all.
  void free_slow(void* ptr, Stream stream, const std::size_t* expected_bytes) {
    const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
    for (PoolShard* owner : all_shards()) {
      std::lock_guard lock(owner->mutex);
      Block* block = owner->find_live(addr);
      if (block == nullptr) continue;
      check_size(block, ptr, expected_bytes);
      // Work on these streams may still use the block; the owner reuses it only after.
      detail::PendingFree entry{block, {}};
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
      live_of(*owner).bytes.sub(block->requested);
      if (entry.events.empty()) {
        owner->forget_live(block);
        recycle(*owner, block);
      } else {
        owner->pending.reserve(owner->pending.size() + 1);
        owner->forget_live(block);
        owner->pending.push_back(std::move(entry));
      }
      return;
    }
    throw InvalidPointer(name() + ": free of " + pointer_text(ptr) + ", which is " +
                             describe_foreign(addr),
                         ptr);
  }

  std::string describe_foreign(std::uintptr_t addr) const {
    for (PoolShard* shard : all_shards()) {
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

  std::size_t allocation_size(const void* ptr) const {
    const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
    for (PoolShard* shard : all_shards()) {
      std::lock_guard lock(shard->mutex);
      if (const Block* block = shard->find_live(addr)) return block->requested;
    }
    throw InvalidPointer(name() + ": " + pointer_text(ptr) + " is " + describe_foreign(addr), ptr);
  }

  // --- record_stream ----------------------------------------------------------------------
  void record_stream(void* ptr, Stream stream) {
    if (ptr == nullptr) return;
    const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
    for (PoolShard* shard : all_shards()) {
      std::lock_guard lock(shard->mutex);
      Block* block = shard->find_live(addr);
      if (block == nullptr) continue;
      if (stream == shard->stream) return;
      if (block->other_streams == nullptr) block->other_streams = new std::vector<Stream>();
      std::vector<Stream>& users = *block->other_streams;
      if (std::find(users.begin(), users.end(), stream) == users.end()) users.push_back(stream);
      return;
    }
    throw InvalidPointer(name() + ": record_stream of " + pointer_text(ptr) + ", which is " +
                             describe_foreign(addr),
                         ptr);
  }

  // --- trim -------------------------------------------------------------------------------
  std::size_t trim() {
    const ShardTable* t = table.load(std::memory_order_acquire);
    for (std::size_t i = 0; i < t->shards.size(); ++i) {
      PoolShard* shard = t->shards[i];
      const std::size_t page_size = page_size_at(i);
      std::vector<std::uint32_t> freed;
      {
        std::lock_guard lock(shard->mutex);
        if (!shard->pending.empty()) shard->collect_pending(events, true);
        try {
          steal_pages(*shard, page_size, SIZE_MAX, freed);
        } catch (...) {
          give_back_reused(freed, page_size);
          throw;
        }
      }
      give_back_reused(freed, page_size);
    }
    return destroy_spares();
  }

  // --- figures ----------------------------------------------------------------------------
  OutOfMemoryInfo oom_info(std::size_t requested) const {
    OutOfMemoryInfo info;
    info.requested = requested;
    info.reserved = counters.physical.current();
    std::size_t allocated = 0;
    for (PoolShard* shard : all_shards()) {
      std::lock_guard lock(shard->mutex);
      info.live += shard->figures.live_bytes;
      allocated += shard->figures.allocated_bytes;
    }
    info.largest_free = info.reserved - std::min(info.reserved, allocated);
    info.capacity = capacity();
    return info;
  }

  // The standard message plus what only this pool knows.
  std::string oom_detail(const std::string& why) const {
    return why + "; mapped " + format_bytes(counters.mapped.current()) + ", spare chunks " +
           format_bytes(spare_bytes());
  }

  std::size_t spare_bytes() const {
    std::lock_guard lock(chunk_mutex);
    return small_spares.size() * options.small_page_size +
           large_spares.size() * options.large_page_size;
  }

  PoolStats stats() const {
    PoolStats s;
    for (PoolShard* shard : all_shards()) {
      std::lock_guard lock(shard->mutex);
      const detail::ShardFigures& f = shard->figures;
      s.live_bytes += f.live_bytes;
      s.allocated_bytes += f.allocated_bytes;
      s.peak_allocated_bytes += f.peak_allocated_bytes;
      s.live_allocations += f.live_allocations;
      s.peak_live_allocations += f.peak_live_allocations;
      s.allocations += f.allocations;
      s.frees += f.frees;
      s.pending_free_bytes += shard->pending_bytes();
    }
    s.streams = count_streams();
    s.peak_live_bytes = peak_live();
    s.reserved_bytes = counters.physical.current();
    s.peak_reserved_bytes = counters.physical.peak();
    s.peak_allocated_bytes = std::min(s.peak_allocated_bytes, s.peak_reserved_bytes);
    s.peak_live_bytes = std::min(s.peak_live_bytes, s.peak_allocated_bytes);
    // Pending blocks still hold their pages: count them as allocated for "free".
    const std::size_t held = std::min(s.reserved_bytes, s.allocated_bytes + s.pending_free_bytes);
    s.free_bytes = s.reserved_bytes - std::min(s.reserved_bytes, s.allocated_bytes);
    s.largest_free_block = s.reserved_bytes - held;
    const std::size_t chunk_count = live_chunks();
    s.segments = chunk_count;
    s.peak_segments = std::max(chunk_count, peak_chunks());
    s.segment_allocations = counters.creates.load(std::memory_order_relaxed);
    s.segment_releases = counters.destroys.load(std::memory_order_relaxed);
    s.oom_retries = counters.oom_retries.load(std::memory_order_relaxed);
    s.ooms = counters.ooms.load(std::memory_order_relaxed);
    return s;
  }

  // Exact with one stream; with several, the sum of the streams' peaks (an upper bound).
  std::size_t peak_live() const {
    std::lock_guard lock(registry_mutex);
    std::size_t peak = 0;
    for (const auto& live : stream_live) peak += live->bytes.peak();
    return peak;
  }

  std::size_t count_streams() const {
    const ShardTable* t = table.load(std::memory_order_acquire);
    std::vector<Stream> seen;
    for (const ShardKey& key : t->keys) {
      if (std::find(seen.begin(), seen.end(), key.stream) == seen.end()) seen.push_back(key.stream);
    }
    return seen.size();
  }

  std::size_t live_chunks() const {
    std::lock_guard lock(chunk_mutex);
    return chunks.size() - free_chunk_slots.size();
  }

  // Chunks are created one page at a time, so the peak count follows the peak bytes when
  // every class uses one page size; with two sizes it is bounded by peak bytes / smaller.
  std::size_t peak_chunks() const {
    const std::size_t smallest = std::min(options.small_page_size, options.large_page_size);
    return counters.physical.peak() / smallest;
  }

  VirtualMemoryPoolStats vm_stats() const {
    VirtualMemoryPoolStats s;
    s.mapped_bytes = counters.mapped.current();
    s.peak_mapped_bytes = counters.mapped.peak();
    s.physical_bytes = counters.physical.current();
    s.peak_physical_bytes = counters.physical.peak();
    s.spare_bytes = spare_bytes();
    for (PoolShard* shard : all_shards()) {
      std::lock_guard lock(shard->mutex);
      s.live_bytes += shard->figures.live_bytes;
    }
    s.peak_live_bytes = peak_live();
    s.address_space_bytes = counters.address_space.current();
    s.ranges = counters.ranges.current();
    s.maps = counters.maps.load(std::memory_order_relaxed);
    s.unmaps = counters.unmaps.load(std::memory_order_relaxed);
    s.creates = counters.creates.load(std::memory_order_relaxed);
    s.destroys = counters.destroys.load(std::memory_order_relaxed);
    s.remapped_pages = counters.remapped_pages.load(std::memory_order_relaxed);
    s.ooms = counters.ooms.load(std::memory_order_relaxed);
    return s;
  }

  void reset_peak() {
    for (PoolShard* shard : all_shards()) {
      std::lock_guard lock(shard->mutex);
      shard->figures.reset_peak();
    }
    counters.mapped.reset_peak();
    counters.physical.reset_peak();
    std::lock_guard lock(registry_mutex);
    for (const auto& live : stream_live) live->bytes.reset_peak();
  }

  [[noreturn]] static void broken(const std::string& what) {
    throw Error("VirtualMemoryPool invariant broken: " + what);
  }

  void check_invariants() const {
    const std::vector<PoolShard*> shards = all_shards();
    std::vector<std::unique_lock<detail::SpinLock>> locks;
    locks.reserve(shards.size());
    for (PoolShard* shard : shards) locks.emplace_back(shard->mutex);
    std::lock_guard chunk_lock(chunk_mutex);
    std::size_t address_space = 0;
    std::size_t mapped_bytes = 0;
    std::vector<char> chunk_mapped(chunks.size(), 0);
    for (PoolShard* shard : shards) {
      shard->check(address_space);
      for (const Segment* s = shard->segments; s != nullptr; s = s->next) {
        const auto& range = *static_cast<const VmRange*>(s);
        std::size_t mapped_pages = 0;
        for (std::uint32_t entry : range.pages) {
          if (entry == 0) continue;
          if (entry > chunks.size() || chunks[entry - 1].bytes != range.page_size) {
            broken("a page is mapped to a chunk that does not exist or has another size");
          }
          if (chunk_mapped[entry - 1]++ != 0) broken("a chunk is mapped at two pages");
          ++mapped_pages;
        }
        if (mapped_pages != range.mapped_pages) broken("mapped page count of a range");
        mapped_bytes += mapped_pages * range.page_size;
        for (const Block* b = s->first; b != nullptr; b = b->next) {
          if (b->indexed) continue;  // free blocks may have unmapped pages
          const std::size_t end = range.end_page(b->end());
          for (std::size_t p = range.first_page(b->addr); p < end; ++p) {
            if (!range.is_mapped(p)) {
              broken("a page under a block in use (live, parked or pending) is not mapped");
            }
          }
        }
      }
    }
    if (address_space != counters.address_space.current()) broken("address space figure");
    if (mapped_bytes != counters.mapped.current()) broken("mapped bytes figure");
    std::size_t physical = 0;
    for (const PhysicalChunk& chunk : chunks) physical += chunk.bytes;
    for (const auto* spares : {&small_spares, &large_spares}) {
      for (std::uint32_t chunk : *spares) {
        if (chunk >= chunks.size() || chunks[chunk].bytes == 0) broken("spare chunk missing");
        if (chunk_mapped[chunk]++ != 0) broken("a spare chunk is also mapped");
      }
    }
    for (std::size_t i = 0; i < chunks.size(); ++i) {
      if (chunks[i].bytes != 0 && chunk_mapped[i] == 0) broken("a chunk is neither mapped nor spare");
    }
    if (physical != counters.physical.current()) broken("physical bytes figure");
  }

  std::size_t capacity() const {
    return options.max_physical_bytes != 0 ? options.max_physical_bytes
                                           : memory.physical_capacity();
  }

  std::string name() const { return "VirtualMemoryPool(" + memory.name() + ")"; }

  ~Impl() {
    for (PoolShard* shard : all_shards()) {
      std::lock_guard lock(shard->mutex);
      shard->collect_pending(events, true);  // gives the events back
      shard->live.for_each([](std::uintptr_t, Block* block) {
        delete block->other_streams;
        block->other_streams = nullptr;
      });
      for (Segment* s = shard->segments; s != nullptr;) {
        Segment* next = s->next;
        auto* range = static_cast<VmRange*>(s);
        for (std::size_t p = 0; p < range->pages.size(); ++p) {
          if (range->pages[p] == 0) continue;
          try {
            memory.unmap(reinterpret_cast<void*>(range->page_address(p)), range->page_size,
                         shard->stream);
            memory.destroy(chunks[range->pages[p] - 1]);
          } catch (const Error&) {
            // A destructor cannot report it; the memory is lost with the VirtualMemory.
          }
        }
        try {
          memory.release(reinterpret_cast<void*>(range->base), range->size);
        } catch (const Error&) {
        }
        delete range;
        s = next;
      }
      shard->segments = nullptr;
    }
    for (const auto* spares : {&small_spares, &large_spares}) {
      for (std::uint32_t chunk : *spares) {
        try {
          memory.destroy(chunks[chunk]);
        } catch (const Error&) {
        }
      }
    }
  }

  // Pool-wide figures. Gauges are updated under the lock of the shard whose pages change
  // (mapped) or the chunk lock's callers (physical).
  struct Counters {
    Gauge mapped;
    Gauge physical;
    Gauge address_space;
    Gauge ranges;
    std::atomic<std::uint64_t> maps{0};
    std::atomic<std::uint64_t> unmaps{0};
    std::atomic<std::uint64_t> creates{0};
    std::atomic<std::uint64_t> destroys{0};
    std::atomic<std::uint64_t> remapped_pages{0};
    std::atomic<std::uint64_t> oom_retries{0};
    std::atomic<std::uint64_t> ooms{0};
  };

  VirtualMemory& memory;
  VirtualMemoryPoolOptions options;
  StreamEvents& events;
  mutable Counters counters;

  std::atomic<std::size_t> committed{0};  // physical bytes created or being created
  mutable std::mutex chunk_mutex;
  std::vector<PhysicalChunk> chunks;
  std::vector<std::uint32_t> free_chunk_slots;
  std::vector<std::uint32_t> small_spares;
  std::vector<std::uint32_t> large_spares;

  std::atomic<const ShardTable*> table{nullptr};
  mutable std::mutex registry_mutex;
  std::vector<std::unique_ptr<ShardTable>> tables;
  std::vector<std::unique_ptr<PoolShard>> owned_shards;
  std::vector<std::size_t> page_sizes;  // of owned_shards, by index
  std::vector<std::unique_ptr<StreamLive>> stream_live;
  std::size_t slow_path_peak_live = 0;  // see within_growth_slack; under registry_mutex
};

// =======================================================================================
// VirtualMemoryPool

VirtualMemoryPool::VirtualMemoryPool(VirtualMemory& memory, VirtualMemoryPoolOptions options)
    : impl_(std::make_unique<Impl>(memory, options)) {}

VirtualMemoryPool::~VirtualMemoryPool() = default;

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

void VirtualMemoryPool::record_stream(void* ptr, Stream stream) {
  impl_->record_stream(ptr, stream);
}

std::size_t VirtualMemoryPool::allocation_size(const void* ptr) const {
  return impl_->allocation_size(ptr);
}

std::size_t VirtualMemoryPool::trim() { return impl_->trim(); }

PoolStats VirtualMemoryPool::stats() const { return impl_->stats(); }

VirtualMemoryPoolStats VirtualMemoryPool::vm_stats() const { return impl_->vm_stats(); }

void VirtualMemoryPool::reset_peak() { impl_->reset_peak(); }

void VirtualMemoryPool::check_invariants() const { impl_->check_invariants(); }

const VirtualMemoryPoolOptions& VirtualMemoryPool::options() const { return impl_->options; }

VirtualMemory& VirtualMemoryPool::memory() const { return impl_->memory; }

std::size_t VirtualMemoryPool::capacity() const { return impl_->capacity(); }

std::string VirtualMemoryPool::name() const { return impl_->name(); }

}  // namespace sdalloc
