// shim_config.hpp - the PyTorch shim's settings and their text form (SDALLOC_CONF).
//
// The syntax is PyTorch's PYTORCH_CUDA_ALLOC_CONF: comma-separated `key:value` pairs, e.g.
// "backend:cuda,mode:vmm,memory_fraction:0.9". Keys and their meaning are listed in
// include/sdalloc/torch_shim.h. parse_shim_config() rejects an unknown key, a repeated key, a
// missing ':' and a bad value with InvalidArgument("SDALLOC_CONF: <what>, in '<pair>'"), so a
// typo never silently falls back to a default. Sizes take binary suffixes (B, K/KiB, M/MiB,
// G/GiB, T/TiB). A granularity given without min_segment / huge_threshold raises those to
// at least the granularity. format_shim_config() writes every key, and parsing its output gives the
// same settings back.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "sdalloc/policies/caching_pool.hpp"

namespace sdalloc::torch_shim {

enum class Backend { kCuda, kHost };
enum class Mode { kPool, kAsync, kVmm, kPlanned };

struct ShimConfig {
  Backend backend = Backend::kCuda;
  Mode mode = Mode::kPool;
  std::size_t capacity = 0;      // per-device cap in bytes; 0: none
  double memory_fraction = 0.0;  // of the device's memory (host: of capacity); 0: none
  CachingPoolOptions pool;       // granularity, segments, growth policy
  std::size_t replan_after = 3;  // mode:planned: divergent steps in a row before re-recording
  std::size_t max_plans = 4;     // mode:planned: plans kept at once (kinds of step)
};

// Throws InvalidArgument as described above; checks the pool options too.
ShimConfig parse_shim_config(std::string_view text);
std::string format_shim_config(const ShimConfig& config);

// "123", "2MiB", "1.5GiB" -> bytes; throws InvalidArgument naming the text.
std::size_t parse_size(std::string_view text);

}  // namespace sdalloc::torch_shim
