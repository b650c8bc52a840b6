// vm_pool_impl.hpp - VirtualMemoryPool::Impl: the stream-ordered core over reserved ranges
// with physical pages mapped on demand (internal to src/policies/virtual_memory_pool/).
//
// Each stream has a shard (VmShard, a PoolShard) whose "segments" are reserved address
// ranges (VmRange, a Segment with a page table). Blocks, best fit, quick lists and
// the live table are the shard's; shards, cross-stream frees, checks and figures are the
// core's (src/pool/stream_ordered_core.hpp). What virtual memory adds:
//
//   page table   per range, one entry per page: the index of the chunk mapped there + 1,
//                or 0. Guarded by the owning shard's lock.
//   chunks       pool-wide table of chunks (index -> PhysicalChunk) and the spare lists
//                (chunks held but unmapped), guarded by chunk_mutex. Taken only on the slow
//                path, and a leaf: nothing else is locked while it is held (the slow path
//                may hold its shard's lock and, moving their pages, other shards' locks
//                taken without waiting when it takes it).
//
// Invariant: every page that overlaps a block that is not in a free index (live, parked in
// a quick list, pending a cross-stream free, or being carved) is mapped. So a quick-list hit
// needs no page check at all, and a best fit only checks the pages of the block it chose.
//
// Files: fast_path.cpp (allocate, free, the slow path's levels), pages.cpp (backing a block:
// gathering chunks, mapping, moving free pages), chunks.cpp (the chunk table, spares, the
// physical cap, trim), virtual_memory_pool.cpp (options, hooks, figures, invariants).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "pool/block.hpp"
#include "pool/block_limits.hpp"
#include "pool/pool_counters.hpp"
#include "pool/pool_shard.hpp"
#include "pool/stream_ordered_core.hpp"
#include "sdalloc/policies/virtual_memory_pool.hpp"

namespace sdalloc {

static_assert(VirtualMemoryPool::kRounding == detail::kBlockRounding);
static_assert(VirtualMemoryPool::kMaxAlignment == detail::kMaxBlockAlignment);
static_assert(VirtualMemoryPool::kMaxAllocation == detail::kMaxBlockAllocation);

namespace vm_detail {

// A reserved address range: a Segment of its shard, plus which chunk backs each page.
struct VmRange : detail::Segment {
  std::size_t page_size = 0;
  std::vector<std::uint32_t> pages;  // chunk index + 1, or 0: unmapped; grows on demand
  std::size_t mapped_pages = 0;

  bool is_mapped(std::size_t page) const { return page < pages.size() && pages[page] != 0; }
  // `end` cut to the pages ever mapped: a scan for mapped pages stops there, not at the end
  // of a free block that may span most of a large reservation (millions of pages).
  std::size_t mapped_scan_end(std::size_t end) const {
    return end < pages.size() ? end : pages.size();
  }
  std::uintptr_t page_address(std::size_t page) const { return base + page * page_size; }
  std::size_t first_page(std::uintptr_t addr) const { return (addr - base) / page_size; }
  // One past the last page that [addr, end) overlaps.
  std::size_t end_page(std::uintptr_t end) const {
    return (end - base + page_size - 1) / page_size;
  }
};

inline VmRange& range_of(const detail::Block* block) {
  return *static_cast<VmRange*>(block->segment);
}

// One stream's shard. `live` mirrors figures.live_bytes for readers without the shard's
// lock (the growth slack sums every stream's): written only under the lock, with a plain
// store, so the hot path pays no atomic read-modify-write.
struct VmShard final : detail::PoolShard {
  explicit VmShard(Stream s) : PoolShard(s) {}
  std::atomic<std::size_t> live{0};
  void publish_live() { live.store(figures.live_bytes, std::memory_order_relaxed); }
};

inline VmShard& vm_shard(detail::PoolShard& shard) { return static_cast<VmShard&>(shard); }

// Pool-wide figures. Gauges are updated under the lock of the shard whose pages change
// (mapped) or the chunk lock's callers (physical).
struct Counters {
  detail::Gauge mapped;
  detail::Gauge physical;
  detail::Gauge address_space;
  detail::Gauge ranges;
  std::atomic<std::uint64_t> maps{0};
  std::atomic<std::uint64_t> unmaps{0};
  std::atomic<std::uint64_t> failed_unmaps{0};  // eager unmaps a free could not make
  std::atomic<std::uint64_t> creates{0};
  std::atomic<std::uint64_t> destroys{0};
  std::atomic<std::uint64_t> moves{0};  // VirtualMemory::move calls
  std::atomic<std::uint64_t> remapped_pages{0};
};

// Chunks in hand during one attempt: free pages still mapped where they are, to move
// (mapped there again if unused), those taken from spares or unmapped from free pages
// (which go back to the spares if unused) and those created now (destroyed if unused, so
// a failed request leaves the physical footprint as it was).
struct Gathered {
  // A free page of the requesting shard that stays mapped until it is moved under the
  // request (where the VirtualMemory can move: one call per run instead of an unmap and a
  // map per page). Its range's page table shows it unmapped from the moment it is taken,
  // so no second look takes it again; put back, it shows it mapped again.
  struct Moving {
    VmRange* range = nullptr;
    std::size_t page = 0;
    std::uint32_t chunk = 0;
    Stream last_use;  // the stream of the shard it belongs to
  };
  std::vector<Moving> moving;  // by chunk handle, once ordered for mapping
  // Other shards whose pages are in `moving`: locked (try_lock) until the attempt ends;
  // every exit of back_pages has moved or put back their pages before.
  std::vector<std::unique_lock<detail::SpinLock>> held;
  std::vector<std::uint32_t> reused;
  std::vector<std::uint32_t> created;
  std::vector<std::uint32_t> created_now;  // every chunk created in this attempt, sorted
  std::size_t size() const { return moving.size() + reused.size() + created.size(); }
  std::uint32_t take();
  // A chunk taken but not kept goes back to the list it came from.
  void put_back(std::uint32_t chunk);
};

}  // namespace vm_detail

struct VirtualMemoryPool::Impl final : detail::StreamOrderedCore {
  using VmRange = vm_detail::VmRange;
  using VmShard = vm_detail::VmShard;
  using Gathered = vm_detail::Gathered;

  Impl(VirtualMemory& vm, VirtualMemoryPoolOptions opts);
  ~Impl() override;

  // --- the core's hooks (virtual_memory_pool.cpp) -------------------------------------
  std::string name() const override;
  OutOfMemoryInfo oom_info(std::size_t requested) const override;
  std::unique_ptr<PoolShard> make_shard(const ShardKey& key) override;
  void on_free(PoolShard& owner, const Block* block) override;
  void recycle(PoolShard& owner, Block* block, std::unique_lock<detail::SpinLock>& lock) override;
  void destroy_segment(PoolShard& shard, Segment* segment) noexcept override;

  // --- allocate and free (fast_path.cpp) ----------------------------------------------
  static Fit fit_for(std::size_t bytes, std::size_t alignment) {
    // Address space is plentiful: no block is set aside for huge requests.
    return StreamOrderedCore::fit_for(bytes, alignment);
  }
  // Whether the part of free block `found` that carve() would hand out is mapped.
  static bool pages_mapped_for(const Block* found, const Fit& fit);
  void* allocate(std::size_t bytes, std::size_t alignment, Stream stream);
  void free(void* ptr, Stream stream, const std::size_t* expected_bytes);

  enum class Level { kOwn, kOthers, kOutOfMemory };
  // How an attempt ended without memory: why, and whether a later level could help (a
  // refused reservation or mapping will not be different after moving pages).
  struct Attempt {
    std::string failure;
    bool final = false;
    // Pages the block lacked after this shard's own (0: not known): what the next level
    // takes from other shards that it could not lock at once (their pages go by unmap and
    // map, the dearer way), so no more of them than needed.
    std::size_t short_pages = 0;
  };
  void* allocate_slow(PoolShard& shard, const Fit& fit, std::size_t bytes);
  void* try_allocate(PoolShard& shard, const Fit& fit, std::size_t bytes, Level level,
                     Attempt& attempt);
  // Reserves a new range for `shard`, big enough for `fit`, and answers its one free block.
  Block* add_range(PoolShard& shard, const Fit& fit);

  // --- pages (pages.cpp) --------------------------------------------------------------
  // Answers false with `attempt` saying why (final when no later level can help).
  bool back_pages(PoolShard& shard, Block* block, Level level, Attempt& attempt);
  void gather(PoolShard& shard, std::size_t missing, std::size_t request_bytes, Level level,
              Gathered& got, std::string& failure);
  bool within_growth_slack(std::size_t bytes, std::size_t request_bytes);
  void map_pages(PoolShard& shard, VmRange& range, std::size_t first, std::size_t end,
                 Gathered& got);
  [[noreturn]] void rethrow_map_failure() const;
  std::uint32_t unmap_page(VmRange& range, std::size_t page, Stream last_use);
  // `defer` (the requesting shard's own pages, where the memory can move): the pages stay
  // mapped and go to `defer` instead of being unmapped into `out`.
  std::size_t steal_pages(PoolShard& shard, std::size_t want, std::vector<std::uint32_t>& out,
                          std::vector<Gathered::Moving>* defer = nullptr);
  // Moves got.moving's pages from the front under the unmapped pages of [p, end), a run of
  // them per call, and answers the first page after them; the moved pages join `mapped_here`.
  std::size_t move_pages(VmRange& range, std::size_t p, std::size_t end, Gathered& got,
                         std::vector<std::size_t>& mapped_here);
  // The pages of got.moving that did not move are mapped where they are: the table says so
  // again.
  static void keep_in_place(Gathered& got);
  void steal_from_other_shards(PoolShard& requester, std::size_t want, bool wait);
  // Where the memory can move: free pages of other idle shards into
  // got.moving, each such shard locked without waiting (one busy now keeps its pages, and
  // two threads that each hold a shard never wait for each other) and held in got.held
  // (a thread of that shard spins meanwhile: the rest of the attempt, a few system calls).
  void steal_to_move(PoolShard& requester, std::size_t want, Gathered& got);
  // Returns a forgotten block to its shard's free space (caller holds the shard's lock);
  // with eager_unmap, unmaps the pages no allocation uses any more.
  void recycle_block(PoolShard& shard, Block* block);

  // --- chunks (chunks.cpp) ------------------------------------------------------------
  PhysicalChunk chunk_at(std::uint32_t index) const;
  // Sorts the chunks in hand so that take() answers them in increasing handle order, and
  // the pages to move by address.
  void order_for_mapping(Gathered& got) const;
  void take_spares(std::size_t want, std::vector<std::uint32_t>& out);
  void give_back_reused(std::vector<std::uint32_t>& reused);
  void give_back(Gathered& got);
  void create_chunks(std::size_t want, std::vector<std::uint32_t>& out, std::string& failure);
  bool commit(std::size_t bytes);
  void uncommit(std::size_t bytes) { committed.fetch_sub(bytes, std::memory_order_relaxed); }
  std::uint32_t add_chunk(PhysicalChunk chunk);
  void destroy_chunk(std::uint32_t index);
  std::size_t destroy_spares();
  std::size_t trim();

  // --- figures and invariants (virtual_memory_pool.cpp) -------------------------------
  std::string oom_detail(const std::string& why) const;
  std::size_t spare_bytes() const;
  PoolStats stats() const;
  std::size_t live_chunks() const;
  std::size_t peak_chunks() const;
  VirtualMemoryPoolStats vm_stats() const;
  void reset_peak();
  PoolLayout layout() const;
  void check_invariants() const;
  std::size_t cap() const { return physical_cap.load(std::memory_order_relaxed); }
  std::size_t capacity() const {
    const std::size_t own = cap();
    return own != 0 ? own : memory.physical_capacity();
  }
  // Most physical bytes this pool could ever hold: the cap, or what the VirtualMemory can
  // ever have (0: unknown). A request needing more pages is refused at once.
  std::size_t physical_ceiling() const {
    const std::size_t vm = memory.physical_ceiling();
    const std::size_t own = cap();
    if (own == 0) return vm;
    return vm == 0 ? own : std::min(own, vm);
  }

  VirtualMemory& memory;
  VirtualMemoryPoolOptions options;
  mutable vm_detail::Counters counters;

  std::atomic<std::size_t> committed{0};     // physical bytes created or being created
  std::atomic<std::size_t> physical_cap{0};  // options.max_physical_bytes, then set_capacity
  mutable std::mutex chunk_mutex;
  std::vector<PhysicalChunk> chunks;
  std::vector<std::uint32_t> free_chunk_slots;
  std::vector<std::uint32_t> spares;

  // Under the core's registry_mutex():
  std::size_t slow_path_peak_live = 0;  // see within_growth_slack
};

}  // namespace sdalloc
