// counting_virtual_memory.hpp - a VirtualMemory that forwards every call to another and
// counts the pages taken from where they were (each unmap, and each chunk a move takes
// where the inner object moves), so the shim can say how often a mode:vmm pool moves pages
// (each waits for work that may still use it; gpu-check counts them in timed iterations).
//
// Invariant: behaviour is exactly the inner object's; only unmaps() is added.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "sdalloc/core/virtual_memory.hpp"

namespace sdalloc::torch_shim {

class CountingVirtualMemory final : public VirtualMemory {
 public:
  explicit CountingVirtualMemory(std::unique_ptr<VirtualMemory> inner) : inner_(std::move(inner)) {}

  [[nodiscard]] std::size_t granularity() const override { return inner_->granularity(); }
  void* reserve(std::size_t bytes, std::size_t alignment) override {
    return inner_->reserve(bytes, alignment);
  }
  void release(void* base, std::size_t bytes) override { inner_->release(base, bytes); }
  PhysicalChunk create(std::size_t bytes) override { return inner_->create(bytes); }
  void destroy(PhysicalChunk chunk) override { inner_->destroy(chunk); }
  void map(void* address, PhysicalChunk chunk) override { inner_->map(address, chunk); }
  [[nodiscard]] bool maps_runs() const override { return inner_->maps_runs(); }
  void map_run(void* address, const PhysicalChunk* chunks, std::size_t count) override {
    inner_->map_run(address, chunks, count);
  }
  void unmap(void* address, std::size_t bytes, Stream last_use) override {
    inner_->unmap(address, bytes, last_use);
    unmaps_.fetch_add(1, std::memory_order_relaxed);
  }
  [[nodiscard]] bool can_move() const override { return inner_->can_move(); }
  void move(void* from, void* to, const PhysicalChunk* chunks, std::size_t count,
            Stream last_use) override {
    inner_->move(from, to, chunks, count, last_use);
    unmaps_.fetch_add(count, std::memory_order_relaxed);  // pages, as unmap counts them
  }
  [[nodiscard]] std::size_t physical_capacity() const override {
    return inner_->physical_capacity();
  }
  [[nodiscard]] std::size_t physical_ceiling() const override { return inner_->physical_ceiling(); }
  [[nodiscard]] std::string name() const override { return inner_->name(); }

  [[nodiscard]] std::uint64_t unmaps() const { return unmaps_.load(std::memory_order_relaxed); }

 private:
  std::unique_ptr<VirtualMemory> inner_;
  std::atomic<std::uint64_t> unmaps_{0};
};

}  // namespace sdalloc::torch_shim
