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
using vm_detail::StreamLive;
using vm_detail::vm_shard;
using vm_detail::VmRange;

namespace {
constexpr std::size_t kDefaultPageSize = std::size_t{64} << 10;
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
  if (options.large_page_size == 0) {
    options.large_page_size = std::max(granularity, kDefaultPageSize);
  }
  if (options.small_page_size == 0) {
    options.small_page_size = std::max(granularity, kDefaultPageSize);
  }
  options.range_size =
      round_up(options.range_size, std::max(options.large_page_size, options.small_page_size));
}

VirtualMemoryPool::Impl::~Impl() {
  release_all();
  for (const auto* spares : {&small_spares, &large_spares}) {
    for (std::uint32_t chunk : *spares) {
      try {
        memory.destroy(chunks[chunk]);
      } catch (const Error&) {
      }
    }
  }
}

std::string VirtualMemoryPool::Impl::name() const {
  return "VirtualMemoryPool(" + memory.name() + ")";
}

// One StreamLive per stream, shared by its shards (under the registry lock).
std::unique_ptr<PoolShard> VirtualMemoryPool::Impl::make_shard(const ShardKey& key) {
  StreamLive* live = nullptr;
  for (const auto& candidate : stream_live) {
    if (candidate->stream == key.stream) live = candidate.get();
  }
  if (live == nullptr) {
    stream_live.push_back(std::make_unique<StreamLive>());
    live = stream_live.back().get();
    live->stream = key.stream;
  }
  return std::make_unique<VmShard>(key.stream, live, page_size_of(key.kind == kind_of(true)));
}

void VirtualMemoryPool::Impl::on_free(PoolShard& owner, const Block* block) {
  vm_shard(owner).live->bytes.sub(block->requested);
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
  return small_spares.size() * options.small_page_size +
         large_spares.size() * options.large_page_size;
}

PoolStats VirtualMemoryPool::Impl::stats() const {
  PoolStats s = shard_stats();
  s.streams = stream_count();
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
  s.failed_releases = counters.failed_unmaps.load(std::memory_order_relaxed);
  return s;
}

// Exact with one stream; with several, the sum of the streams' peaks (an upper bound).
std::size_t VirtualMemoryPool::Impl::peak_live() const {
  std::lock_guard lock(registry_mutex());
  std::size_t peak = 0;
  for (const auto& live : stream_live) peak += live->bytes.peak();
  return peak;
}

std::size_t VirtualMemoryPool::Impl::live_chunks() const {
  std::lock_guard lock(chunk_mutex);
  return chunks.size() - free_chunk_slots.size();
}

// Chunks are created one page at a time, so the peak count follows the peak bytes when
// every class uses one page size; with two sizes it is bounded by peak bytes / smaller.
std::size_t VirtualMemoryPool::Impl::peak_chunks() const {
  const std::size_t smallest = std::min(options.small_page_size, options.large_page_size);
  return counters.physical.peak() / smallest;
}

VirtualMemoryPoolStats VirtualMemoryPool::Impl::vm_stats() const {
  VirtualMemoryPoolStats s;
  s.mapped_bytes = counters.mapped.current();
  s.peak_mapped_bytes = counters.mapped.peak();
  s.physical_bytes = counters.physical.current();
  s.peak_physical_bytes = counters.physical.peak();
  s.spare_bytes = spare_bytes();
  for (PoolShard* shard : shards()) {
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
  s.moves = counters.moves.load(std::memory_order_relaxed);
  s.remapped_pages = counters.remapped_pages.load(std::memory_order_relaxed);
  s.ooms = ooms().load(std::memory_order_relaxed);
  return s;
}

void VirtualMemoryPool::Impl::reset_peak() {
  reset_shard_peaks();
  counters.mapped.reset_peak();
  counters.physical.reset_peak();
  std::lock_guard lock(registry_mutex());
  for (const auto& live : stream_live) live->bytes.reset_peak();
}

// =======================================================================================
// Impl: invariants

namespace {
[[noreturn]] void broken(const std::string& what) {
  throw Error("VirtualMemoryPool invariant broken: " + what);
}
}  // namespace

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

std::string VirtualMemoryPool::name() const { return impl_->name(); }

}  // namespace sdalloc
