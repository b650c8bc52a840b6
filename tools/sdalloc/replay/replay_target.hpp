// tools/sdalloc/replay/replay_target.hpp - sdalloc's allocators as `sdalloc replay` runs them.
//
// A ReplayTarget is one fresh instance of an allocator in this process, over host memory,
// with what the replay needs around it: the resource to allocate from, the pass boundaries
// (PlannedArena's steps), and how many bytes it holds from the system now and at most.
// Held bytes are measured under the allocator (a StatsResource between it and the host
// memory, or the allocator's own count of mapped physical memory), never estimated.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "sdalloc/core/resource.hpp"
#include "sdalloc/policies/caching_pool.hpp"

namespace sdalloc::replay {

// How to build a target. capacity 0: no limit; otherwise the allocator may hold at most
// that many bytes (a LimitResource, or the physical cap of a virtual-memory pool), and a
// replay that needs more fails with sdalloc::OutOfMemory.
struct TargetSettings {
  std::uint64_t capacity = 0;
  bool huge_pages = false;             // HostResource asks for transparent huge pages
  bool pool_keep_cache = false;        // CachingPool: never release cached segments to grow
  bool pool_no_consolidation = false;  // CachingPool: keep a churning stream's segments
  bool vmm_no_moves = false;           // VirtualMemoryPool: unmap and map the pages it
                                       // moves (HostVirtualMemory without move_mappings)
  bool device_like = false;            // vmm: 2 MiB pages that cannot move, as CUDA's
                                       // (--device-like)
  CachingPoolOptions pool;             // pool and planned's fallback (--pool-conf); the two
                                       // pool_ flags above override its growth settings
};

class ReplayTarget {
 public:
  ReplayTarget() = default;
  ReplayTarget(const ReplayTarget&) = delete;
  ReplayTarget& operator=(const ReplayTarget&) = delete;
  virtual ~ReplayTarget() = default;

  virtual MemoryResource& resource() = 0;
  virtual void begin_pass() {}
  virtual void end_pass() {}
  virtual std::uint64_t reserved_bytes() const = 0;       // held from the system now
  virtual std::uint64_t peak_reserved_bytes() const = 0;  // most held at once so far
  // One short line for the table: the allocator's own counts (segments, map operations...).
  virtual std::string counters() const = 0;
  // Calls to the memory under the allocator so far: segments taken and released, pages
  // mapped, unmapped or moved. A repeated pass that makes none has settled.
  virtual std::uint64_t memory_calls() const = 0;
};

struct InProcessAllocator {
  std::string name;         // as given to --allocator
  std::string description;  // one line for the table and the report
  std::function<std::unique_ptr<ReplayTarget>(const TargetSettings&)> make;
};

// vmm, pool, planned (sdalloc's modes), torch-native, torch-expandable, in table order.
const std::vector<InProcessAllocator>& in_process_allocators();

}  // namespace sdalloc::replay
