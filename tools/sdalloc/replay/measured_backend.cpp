// tools/sdalloc/replay/measured_backend.cpp - counting adaptors over host memory
// (measured_backend.hpp).
#include "replay/measured_backend.hpp"

#include <string>
#include <utility>

#include "sdalloc/resources/host_resource.hpp"
#include "sdalloc/resources/host_virtual_memory.hpp"

namespace sdalloc::replay {

void HeldBytes::add(std::size_t bytes) {
  const std::size_t now = current.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  std::size_t seen = peak.load(std::memory_order_relaxed);
  while (now > seen && !peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
  }
}

namespace {

// Segments: what allocate handed out and deallocate took back.
class CountedSegments final : public MemoryResource {
 public:
  CountedSegments(HostResourceOptions options, std::shared_ptr<HeldBytes> held)
      : host_(options), held_(std::move(held)) {}
  std::string name() const override { return host_.name(); }

 private:
  void* do_allocate(std::size_t bytes, Stream stream) override {
    void* ptr = host_.allocate(bytes, stream);
    if (ptr != nullptr) held_->add(bytes);
    return ptr;
  }
  void do_deallocate(void* ptr, std::size_t bytes, Stream stream) override {
    host_.deallocate(ptr, bytes, stream);
    if (ptr != nullptr) held_->sub(bytes);
  }

  HostResource host_;
  std::shared_ptr<HeldBytes> held_;
};

// Virtual memory: the physical chunks created and not yet destroyed; everything else passes.
class CountedVirtualMemory final : public VirtualMemory {
 public:
  CountedVirtualMemory(HostVirtualMemoryOptions options, std::size_t granularity,
                       std::shared_ptr<HeldBytes> held)
      : host_(options), granularity_(granularity), held_(std::move(held)) {}

  std::size_t granularity() const override { return granularity_; }
  void* reserve(std::size_t bytes, std::size_t alignment) override {
    return host_.reserve(bytes, alignment);
  }
  void release(void* base, std::size_t bytes) override { host_.release(base, bytes); }
  PhysicalChunk create(std::size_t bytes) override {
    const PhysicalChunk chunk = host_.create(bytes);
    held_->add(chunk.bytes);
    return chunk;
  }
  void destroy(PhysicalChunk chunk) override {
    host_.destroy(chunk);
    held_->sub(chunk.bytes);
  }
  void map(void* address, PhysicalChunk chunk) override { host_.map(address, chunk); }
  bool maps_runs() const override { return host_.maps_runs(); }
  void map_run(void* address, const PhysicalChunk* chunks, std::size_t count) override {
    host_.map_run(address, chunks, count);
  }
  void unmap(void* address, std::size_t bytes, Stream last_use) override {
    host_.unmap(address, bytes, last_use);
  }
  bool can_move() const override { return host_.can_move(); }
  void move(void* from, void* to, const PhysicalChunk* chunks, std::size_t count,
            Stream last_use) override {
    host_.move(from, to, chunks, count, last_use);
  }
  std::size_t physical_capacity() const override { return host_.physical_capacity(); }
  std::size_t physical_ceiling() const override { return host_.physical_ceiling(); }
  std::string name() const override { return host_.name(); }

 private:
  HostVirtualMemory host_;
  std::size_t granularity_;
  std::shared_ptr<HeldBytes> held_;
};

}  // namespace

MemoryBackend measured_host_backend(const MeasuredBackendOptions& options,
                                    std::shared_ptr<HeldBytes> held) {
  constexpr std::size_t kDevicePage = std::size_t{2} << 20;
  MemoryBackend backend;
  backend.name = "host";
  backend.segments = std::make_unique<CountedSegments>(
      HostResourceOptions{.transparent_huge_pages = options.huge_pages}, held);
  HostVirtualMemoryOptions vm;
  vm.move_mappings = options.virtual_memory_moves && !options.device_like;
  backend.virtual_memory = std::make_unique<CountedVirtualMemory>(
      vm, options.device_like ? kDevicePage : HostVirtualMemory::kPageSize, std::move(held));
  backend.host_pages = true;
  return backend;
}

}  // namespace sdalloc::replay
