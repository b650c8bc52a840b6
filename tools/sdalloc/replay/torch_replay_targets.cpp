#include "replay/torch_replay_targets.hpp"

#include <optional>
#include <string>

#include "replay/torch_caching_model.hpp"
#include "sdalloc/resources/host_resource.hpp"
#include "sdalloc/resources/host_virtual_memory.hpp"
#include "sdalloc/resources/limit_resource.hpp"
#include "sdalloc/resources/stats_resource.hpp"

namespace sdalloc::replay {
namespace {

std::string release_text(const TorchCachingCounters& c) {
  std::string text = ", OOM releases " + std::to_string(c.cache_releases);
  if (c.ooms != 0) text += ", refused " + std::to_string(c.ooms);
  return text;
}

// Segments from host memory, as cudaMalloc's: the model only allocates and deallocates
// whole segments.
class TorchNativeTarget final : public ReplayTarget {
 public:
  explicit TorchNativeTarget(const TargetSettings& settings)
      : host_(HostResourceOptions{.transparent_huge_pages = settings.huge_pages}) {
    MemoryResource* under = &host_;
    if (settings.capacity != 0) under = &limit_.emplace(host_, settings.capacity);
    stats_.emplace(*under);
    model_.emplace(*stats_);
  }
  MemoryResource& resource() override { return *model_; }
  std::uint64_t reserved_bytes() const override { return stats_->stats().current_bytes; }
  std::uint64_t peak_reserved_bytes() const override { return stats_->stats().peak_bytes; }
  std::string counters() const override {
    const TorchCachingCounters c = model_->counters();
    return "segments +" + std::to_string(c.segment_allocations) + " -" +
           std::to_string(c.segment_releases) + release_text(c);
  }
  std::uint64_t memory_calls() const override {
    const TorchCachingCounters c = model_->counters();
    return c.segment_allocations + c.segment_releases;
  }

 private:
  HostResource host_;
  std::optional<LimitResource> limit_;
  std::optional<StatsResource> stats_;
  std::optional<TorchCachingModel> model_;  // destroyed first: gives its segments back
};

// Host pages (HostVirtualMemory); --capacity caps the pages that exist at once.
class TorchExpandableTarget final : public ReplayTarget {
 public:
  explicit TorchExpandableTarget(const TargetSettings& settings)
      : vm_(HostVirtualMemoryOptions{.physical_limit = settings.capacity /
                                                       HostVirtualMemory::kPageSize *
                                                       HostVirtualMemory::kPageSize}),
        model_(vm_, TorchCachingOptions{}) {}
  MemoryResource& resource() override { return model_; }
  std::uint64_t reserved_bytes() const override { return model_.counters().reserved_bytes; }
  std::uint64_t peak_reserved_bytes() const override {
    return model_.counters().peak_reserved_bytes;
  }
  std::string counters() const override {
    const TorchCachingCounters c = model_.counters();
    return "maps " + std::to_string(c.segment_allocations) + " (" + std::to_string(c.pages_mapped) +
           " pages), unmaps " + std::to_string(c.segment_releases) + " (" +
           std::to_string(c.pages_unmapped) + " pages), ranges " + std::to_string(c.ranges) +
           release_text(c);
  }
  std::uint64_t memory_calls() const override {
    const TorchCachingCounters c = model_.counters();
    return c.segment_allocations + c.segment_releases;
  }

 private:
  HostVirtualMemory vm_;
  TorchCachingModel model_;
};

}  // namespace

std::unique_ptr<ReplayTarget> make_torch_native_target(const TargetSettings& settings) {
  return std::make_unique<TorchNativeTarget>(settings);
}

std::unique_ptr<ReplayTarget> make_torch_expandable_target(const TargetSettings& settings) {
  return std::make_unique<TorchExpandableTarget>(settings);
}

}  // namespace sdalloc::replay
