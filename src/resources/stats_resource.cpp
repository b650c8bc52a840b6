// stats_resource.cpp - counters around an upstream resource.
//
// Each figure is its own atomic; a snapshot from stats() is therefore not one instant across
// all fields, but every peak is a value its current figure really had (raised by
// compare-exchange, never by a racy store).
#include "sdalloc/resources/stats_resource.hpp"

namespace sdalloc {
namespace {

void raise_to(std::atomic<std::size_t>& peak, std::size_t value) {
  std::size_t seen = peak.load(std::memory_order_relaxed);
  while (seen < value && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

}  // namespace

ResourceStats StatsResource::stats() const {
  ResourceStats s;
  s.current_bytes = current_bytes_.load(std::memory_order_relaxed);
  s.peak_bytes = peak_bytes_.load(std::memory_order_relaxed);
  s.total_bytes = total_bytes_.load(std::memory_order_relaxed);
  s.current_count = current_count_.load(std::memory_order_relaxed);
  s.peak_count = peak_count_.load(std::memory_order_relaxed);
  s.allocations = allocations_.load(std::memory_order_relaxed);
  s.deallocations = deallocations_.load(std::memory_order_relaxed);
  s.failures = failures_.load(std::memory_order_relaxed);
  return s;
}

void StatsResource::reset_peak() {
  peak_bytes_.store(current_bytes_.load(std::memory_order_relaxed), std::memory_order_relaxed);
  peak_count_.store(current_count_.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

std::string StatsResource::name() const { return "stats(" + upstream_.name() + ")"; }

void* StatsResource::do_allocate(std::size_t bytes, Stream stream) {
  if (bytes == 0) return nullptr;
  void* ptr = nullptr;
  try {
    ptr = upstream_.allocate(bytes, stream);
  } catch (...) {
    failures_.fetch_add(1, std::memory_order_relaxed);
    throw;
  }
  raise_to(peak_bytes_, current_bytes_.fetch_add(bytes, std::memory_order_relaxed) + bytes);
  raise_to(peak_count_, current_count_.fetch_add(1, std::memory_order_relaxed) + 1);
  total_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  allocations_.fetch_add(1, std::memory_order_relaxed);
  return ptr;
}

void StatsResource::do_deallocate(void* ptr, std::size_t bytes, Stream stream) {
  if (ptr == nullptr) return;
  // Counted down before the memory goes back: once upstream has it, another thread may be
  // handed the same bytes, and counting them twice would overstate the peak.
  current_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
  current_count_.fetch_sub(1, std::memory_order_relaxed);
  try {
    upstream_.deallocate(ptr, bytes, stream);
  } catch (...) {  // a pool rejected the pointer: nothing was freed
    current_bytes_.fetch_add(bytes, std::memory_order_relaxed);
    current_count_.fetch_add(1, std::memory_order_relaxed);
    throw;
  }
  deallocations_.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace sdalloc
