// shim_config.hpp - the PyTorch shim's settings and their text form (SDALLOC_CONF).
//
// The syntax is PyTorch's PYTORCH_CUDA_ALLOC_CONF: comma-separated `key:value` pairs, e.g.
// "backend:cuda,mode:vmm,memory_fraction:0.9". The keys are one OptionTable
// (config/option_table.hpp): the shared pool rows of config/pool_conf.hpp plus the shim's
// own (backend, memory_fraction, and mode async); shim_options().markdown() is the table
// in docs/pytorch.md, which a test keeps equal. parse_shim_config() rejects an unknown key, a
// repeated key, a missing ':' and a bad value with InvalidArgument("SDALLOC_CONF: <what>, in
// '<pair>'"), so a typo never silently falls back to a default. Sizes take binary suffixes
// (B, K/KiB, M/MiB, G/GiB, T/TiB). A granularity given without min_segment / huge_threshold
// raises those to at least the granularity. format_shim_config() writes every key (but an
// unset memory_fraction), and parsing its output gives the same settings back.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "config/option_table.hpp"
#include "config/pool_conf.hpp"

namespace sdalloc::torch_shim {

enum class Backend { kCuda, kHost };
using Mode = PoolMode;

// mode, capacity (per device), pool, replan_after and max_plans come from PoolConf.
struct ShimConfig : PoolConf {
  Backend backend = Backend::kCuda;
  double memory_fraction = 0.0;  // of the device's memory (host: of capacity); 0: none
};

// The shim's table: every key, its type, default and help.
const config::OptionTable<ShimConfig>& shim_options();

// Throws InvalidArgument as described above; checks the pool options too.
ShimConfig parse_shim_config(std::string_view text);
std::string format_shim_config(const ShimConfig& config);

// "123", "2MiB", "1.5GiB" -> bytes; throws InvalidArgument naming the text.
using config::parse_size;

}  // namespace sdalloc::torch_shim
