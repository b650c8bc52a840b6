// sdalloc/resources/stats_resource.hpp - counts what passes through to an upstream resource.
//
// StatsResource wraps any resource and keeps current and peak bytes and counts of the
// allocations that went through it. Put it under a pool to see what the pool reserves,
// or over a pool to see what the application asked for. Thread-safe (atomics only; the
// peaks are maintained with compare-exchange so they are never lower than a value the
// current figure really had).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "sdalloc/core/resource.hpp"

namespace sdalloc {

struct ResourceStats {
  std::size_t current_bytes = 0;  // bytes handed out and not yet returned
  std::size_t peak_bytes = 0;     // highest current_bytes since construction or reset_peak()
  std::size_t total_bytes = 0;    // sum of all successful allocations
  std::size_t current_count = 0;  // live allocations
  std::size_t peak_count = 0;
  std::uint64_t allocations = 0;  // successful allocate calls (zero-byte calls not counted)
  std::uint64_t deallocations = 0;
  std::uint64_t failures = 0;  // allocate calls that threw
};

class StatsResource final : public MemoryResource {
 public:
  explicit StatsResource(MemoryResource& upstream) : upstream_(upstream) {}

  ResourceStats stats() const;
  // Sets the peaks to the current figures, e.g. between two phases of a pipeline.
  void reset_peak();

  std::size_t capacity() const override { return upstream_.capacity(); }
  std::string name() const override;
  MemoryResource& upstream() const { return upstream_; }

 private:
  void* do_allocate(std::size_t bytes, Stream stream) override;
  void do_deallocate(void* ptr, std::size_t bytes, Stream stream) override;

  MemoryResource& upstream_;
  std::atomic<std::size_t> current_bytes_{0}, peak_bytes_{0}, total_bytes_{0};
  std::atomic<std::size_t> current_count_{0}, peak_count_{0};
  std::atomic<std::uint64_t> allocations_{0}, deallocations_{0}, failures_{0};
};

}  // namespace sdalloc
