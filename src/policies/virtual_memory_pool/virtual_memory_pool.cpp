// virtual_memory_pool.cpp - VirtualMemoryPool: options, the core's hooks, figures,
// invariants and the facade.
//
// The pool is the stream-ordered core (src/pool/stream_ordered_core.hpp) over reserved
// ranges whose pages are mapped on demand; vm_pool_impl.hpp states the page invariant and
// which file holds which part. Figures take each shard's lock in turn; check_invariants
// takes them all in table order, then the chunk lock.

#include "sdalloc/policies/virtual_memory_pool.hpp"

#include <algorithm>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "policies/virtual_memory_pool/vm_pool_impl.hpp"

namespace sdalloc {

using detail::Block;
using detail::PoolShard;
using detail::Segment;
using vm_detail::vm_shard;
using vm_detail::VmRange;

namespace {
constexpr std::size_t kDefaultPageSize = std::size_t{64} << 10;
}  // namespace

void VirtualMemoryPoolOptions::validate(std::size_t granularity) const {
  auto fail = [](const std::string& what) {
    throw InvalidArgument("VirtualMemoryPoolOptions: " + what);
  };
  if (page_size != 0 && (page_size % granularity != 0 || !is_power_of_two(page_size))) {
    fail("page_size must be 0 or a power-of-two multiple of the granularity (" +
         std::to_string(granularity) + "), got " + std::to_string(page_size));
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
// Impl: lifetime and the core's hooks

VirtualMemoryPool::Impl::Impl(VirtualMemory& vm, VirtualMemoryPoolOptions opts)
    : StreamOrderedCore(opts.stream_events != nullptr ? *opts.stream_events
                                                      : HostStreamEvents::instance()),
      memory(vm),
      options(opts) {
  const std::size_t granularity = memory.granularity();
  if (!is_power_of_two(granularity)) {
    throw InvalidArgument(memory.name() + ": granularity " + std::to_string(granularity) +
                          " is not a power of two");
  }
  options.validate(granularity);
  if (options.page_size == 0) options.page_size = std::max(granularity, kDefaultPageSize);
  options.range_size = round_up(options.range_size, options.page_size);
  physical_cap.store(options.max_physical_bytes, std::memory_order_relaxed);
}

VirtualMemoryPool::Impl::~Impl() {
  release_all();
  for (std::uint32_t chunk : spares) {
    try {
      memory.destroy(chunks[chunk]);
    } catch (const Error&) {  // NOLINT(bugprone-empty-catch): a destructor cannot report it
    }
  }
}

std::string VirtualMemoryPool::Impl::name() const {
  return "VirtualMemoryPool(" + memory.name() + ")";
}

std::unique_ptr<PoolShard> VirtualMemoryPool::Impl::make_shard(const ShardKey& key) {
  return std::make_unique<VmShard>(key.stream);
}

// The block is still live here (free_slow forgets it next): publish what is left.
void VirtualMemoryPool::Impl::on_free(PoolShard& owner, const Block* block) {
  vm_shard(owner).live.store(owner.figures.live_bytes - block->requested,
                             std::memory_order_relaxed);
}

void VirtualMemoryPool::Impl::recycle(PoolShard& owner, Block* block,
                                      std::unique_lock<detail::SpinLock>&) {
  recycle_block(owner, block);
}

void VirtualMemoryPool::Impl::destroy_segment(PoolShard& shard, Segment* segment) noexcept {
  auto* range = static_cast<VmRange*>(segment);
  for (std::size_t p = 0; p < range->pages.size(); ++p) {
    if (range->pages[p] == 0) continue;
    try {
      memory.unmap(reinterpret_cast<void*>(range->page_address(p)), range->page_size, shard.stream);
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
}

// =======================================================================================
// Impl: figures

OutOfMemoryInfo VirtualMemoryPool::Impl::oom_info(std::size_t requested) const {
  OutOfMemoryInfo info;
  info.requested = requested;
  info.reserved = counters.physical.current();
  std::size_t allocated = 0;
  for (PoolShard* shard : shards()) {
    std::lock_guard lock(shard->mutex);
    info.live += shard->figures.live_bytes;
    allocated += shard->figures.allocated_bytes;
  }
  info.largest_free = info.reserved - std::min(info.reserved, allocated);
  info.capacity = capacity();
  return info;
}

// The standard message plus what only this pool knows.
std::string VirtualMemoryPool::Impl::oom_detail(const std::string& why) const {
  return why + "; mapped " + format_bytes(counters.mapped.current()) + ", spare chunks " +
         format_bytes(spare_bytes());
}

std::size_t VirtualMemoryPool::Impl::spare_bytes() const {
  std::lock_guard lock(chunk_mutex);
  return spares.size() * options.page_size;
}

PoolStats VirtualMemoryPool::Impl::stats() const {
  PoolStats s = shard_stats();
  s.streams = stream_count();
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
  s.failed_releases = counters.failed_unmaps.load(std::memory_order_relaxed);
  return s;
}

std::size_t VirtualMemoryPool::Impl::live_chunks() const {
  std::lock_guard lock(chunk_mutex);
  return chunks.size() - free_chunk_slots.size();
}

// Chunks are created one page at a time: the peak count follows the peak bytes.
std::size_t VirtualMemoryPool::Impl::peak_chunks() const {
  return counters.physical.peak() / options.page_size;
}

VirtualMemoryPoolStats VirtualMemoryPool::Impl::vm_stats() const {
  VirtualMemoryPoolStats s;
  s.mapped_bytes = counters.mapped.current();
  s.peak_mapped_bytes = counters.mapped.peak();
  s.physical_bytes = counters.physical.current();
  s.peak_physical_bytes = counters.physical.peak();
  s.spare_bytes = spare_bytes();
  // Exact with one stream; with several, the sum of the streams' peaks (an upper bound).
  for (PoolShard* shard : shards()) {
    std::lock_guard lock(shard->mutex);
    s.live_bytes += shard->figures.live_bytes;
    s.peak_live_bytes += shard->figures.peak_live_bytes;
  }
  s.address_space_bytes = counters.address_space.current();
  s.ranges = counters.ranges.current();
  s.maps = counters.maps.load(std::memory_order_relaxed);
  s.unmaps = counters.unmaps.load(std::memory_order_relaxed);
  s.creates = counters.creates.load(std::memory_order_relaxed);
  s.destroys = counters.destroys.load(std::memory_order_relaxed);
  s.moves = counters.moves.load(std::memory_order_relaxed);
  s.remapped_pages = counters.remapped_pages.load(std::memory_order_relaxed);
  s.ooms = ooms().load(std::memory_order_relaxed);
  return s;
}

void VirtualMemoryPool::Impl::reset_peak() {
  reset_shard_peaks();
  counters.mapped.reset_peak();
  counters.physical.reset_peak();
}

// =======================================================================================
// Impl: invariants

namespace {
[[noreturn]] void broken(const std::string& what) {
  throw Error("VirtualMemoryPool invariant broken: " + what);
}
}  // namespace

PoolLayout VirtualMemoryPool::Impl::layout() const {
  const std::vector<PoolShard*>& all = shards();
  const auto locks = lock_all(all);
  PoolLayout layout;
  for (const PoolShard* shard : all) {
    for (const Segment* s = shard->segments; s != nullptr; s = s->next) {
      const auto& range = *static_cast<const VmRange*>(s);
      const Block* b = s->first;
      for (std::size_t first = 0; first < range.pages.size();) {
        if (!range.is_mapped(first)) {
          ++first;
          continue;
        }
        std::size_t end = first + 1;
        while (range.is_mapped(end)) ++end;
        SegmentLayout& segment = layout.segments.emplace_back();
        segment.address = range.page_address(first);
        segment.size = (end - first) * range.page_size;
        segment.stream = shard->stream;
        const std::uintptr_t run_end = segment.address + segment.size;
        while (b != nullptr && b->end() <= segment.address) b = b->next;
        // A block in use lies on mapped pages only, so only free blocks are cut; the last
        // one may go on into the next run, so it stays current.
        for (const Block* at = b; at != nullptr && at->addr < run_end; at = at->next) {
          const std::uintptr_t from = std::max(at->addr, segment.address);
          const std::uintptr_t to = std::min(at->end(), run_end);
          BlockLayout block{from, to - from, 0, BlockState::kFree};
          if (!at->free && !at->cached) {
            block.requested = at->requested;
            block.state =
                shard->find_live(at->addr) == at ? BlockState::kLive : BlockState::kPendingFree;
          }
          segment.blocks.push_back(block);
          if (at->end() <= run_end) b = at->next;
        }
        first = end;
      }
    }
  }
  std::sort(layout.segments.begin(), layout.segments.end(),
            [](const SegmentLayout& a, const SegmentLayout& b) { return a.address < b.address; });
  return layout;
}

void VirtualMemoryPool::Impl::check_invariants() const {
  const std::vector<PoolShard*>& all = shards();
  const auto locks = lock_all(all);
  std::lock_guard chunk_lock(chunk_mutex);
  const std::size_t address_space = check_shards(all);
  std::size_t mapped_bytes = 0;
  std::vector<char> chunk_mapped(chunks.size(), 0);
  for (const PoolShard* shard : all) {
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
  for (std::uint32_t chunk : spares) {
    if (chunk >= chunks.size() || chunks[chunk].bytes == 0) broken("spare chunk missing");
    if (chunk_mapped[chunk]++ != 0) broken("a spare chunk is also mapped");
  }
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    if (chunks[i].bytes != 0 && chunk_mapped[i] == 0) broken("a chunk is neither mapped nor spare");
  }
  if (physical != counters.physical.current()) broken("physical bytes figure");
}

// =======================================================================================
// VirtualMemoryPool (allocate and free are in fast_path.cpp, next to the fast path)

VirtualMemoryPool::VirtualMemoryPool(VirtualMemory& memory, VirtualMemoryPoolOptions options)
    : impl_(std::make_unique<Impl>(memory, options)) {}

VirtualMemoryPool::~VirtualMemoryPool() = default;

void VirtualMemoryPool::record_stream(void* ptr, Stream stream) {
  impl_->record_stream(ptr, stream, "record_stream");
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

PoolLayout VirtualMemoryPool::layout() const { return impl_->layout(); }

void VirtualMemoryPool::set_capacity(std::size_t max_physical_bytes) {
  impl_->physical_cap.store(max_physical_bytes, std::memory_order_relaxed);
}

std::string VirtualMemoryPool::name() const { return impl_->name(); }

}  // namespace sdalloc
