// sdalloc/core/pool_stats.hpp - what a pool reports about itself.
//
// "Live" bytes are what callers asked for; "allocated" bytes are the blocks that hold them
// after rounding; "reserved" bytes are what the pool holds from its resource. The gaps
// between them are the pool's overheads: reserved - allocated is cached free memory, and
// allocated - live is rounding (a VirtualMemoryPool's spare chunks are in reserved, not in
// free). Peaks
// are high-water marks since construction or the last reset_peak().
//
// Exactness: reserved figures and every current figure are exact (at a quiescent moment).
// Live and allocated peaks are exact while the pool serves one stream. Pools keep those
// figures per stream so that threads on different streams never share a cache line; with
// several streams a pool-wide peak is therefore an upper bound (the sum of the per-stream
// peaks, capped by the next figure up: peak live <= peak allocated <= peak reserved).
//
// to_memory_stats() gives the same figures under the key names of PyTorch's
// torch.cuda.memory_stats(), so tools written for PyTorch can read sdalloc's numbers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

namespace sdalloc {

struct PoolStats {
  std::size_t live_bytes = 0;  // sum of requested sizes of live allocations
  std::size_t peak_live_bytes = 0;
  std::size_t allocated_bytes = 0;  // sum of block sizes of live allocations
  std::size_t peak_allocated_bytes = 0;
  std::size_t reserved_bytes = 0;  // bytes held from below: segments, or physical pages
  std::size_t peak_reserved_bytes = 0;

  std::size_t live_allocations = 0;
  std::size_t peak_live_allocations = 0;
  std::uint64_t allocations = 0;  // successful allocate calls (zero-size ones not counted)
  std::uint64_t frees = 0;

  std::size_t segments = 0;  // segments (VirtualMemoryPool: physical chunks) held now
  std::size_t peak_segments = 0;
  std::uint64_t segment_allocations = 0;  // calls to the resource's allocate
  std::uint64_t segment_releases = 0;     // calls to the resource's deallocate
  std::uint64_t failed_releases = 0;      // deallocate calls that failed: left to the resource

  std::size_t free_bytes = 0;          // reserved - allocated - spare: cached, reusable
  std::size_t largest_free_block = 0;  // the biggest single request servable without growing
  std::size_t pending_free_bytes = 0;  // freed, but waiting for another stream's work
  std::size_t spare_bytes = 0;         // VirtualMemoryPool: chunks held but mapped nowhere
  std::uint64_t oom_retries = 0;       // times the pool released its cache and retried
  std::uint64_t consolidations = 0;    // times an emptied stream's segments became one
  std::uint64_t ooms = 0;              // OutOfMemory errors thrown
  std::size_t streams = 0;             // streams the pool has served

  // External fragmentation of the cached memory, in [0, 1]: 1 - largest_free / free_bytes.
  // 0 means all free memory is one block (or there is none); near 1 means it is in slivers.
  double fragmentation() const;
  // reserved / live at their peaks: how much memory the policy needed beyond the minimum.
  double peak_overhead_ratio() const;
};

// PyTorch-compatible view, e.g. "allocated_bytes.all.current", "reserved_bytes.all.peak",
// "requested_bytes.all.current", "num_alloc_retries", "num_ooms", "segment.all.current".
std::map<std::string, std::int64_t> to_memory_stats(const PoolStats& stats);

// A readable multi-line table of the figures above.
std::string format_stats(const PoolStats& stats);

}  // namespace sdalloc
