// shim_config.cpp - the shim's SDALLOC_CONF table: the shared pool rows plus its own.
#include "shim_config.hpp"

#include <algorithm>
#include <vector>

#include "sdalloc/core/errors.hpp"

namespace sdalloc::torch_shim {
namespace {

using config::EnumName;
using config::Option;

constexpr std::string_view kName = "SDALLOC_CONF";

const EnumName kModeAsync{"async", static_cast<int>(Mode::kAsync),
                          "a CachingPool over a private cudaMallocAsync pool (CUDA only)"};
constexpr std::string_view kSegmentsRetired =
    "retired in 0.2: segments:chunked served the segment cache from CUDA's virtual memory, "
    "which mode:vmm, the default, now uses page by page";

std::vector<Option<ShimConfig>> shim_rows() {
  std::vector<Option<ShimConfig>> rows = config::lift<ShimConfig>(config::pool_options(
      {config::kModeAuto, config::kModePool, kModeAsync, config::kModeVmm, config::kModePlanned}));
  rows.insert(rows.begin(),
              config::enum_option<ShimConfig>(
                  "backend", "where the memory comes from.",
                  {{"cuda", static_cast<int>(Backend::kCuda), "device memory"},
                   {"host", static_cast<int>(Backend::kHost),
                    "host memory, for tests and CPU-only machines; every device index, -1 "
                    "included, gets a host pool"}},
                  [](auto& c) -> auto& { return c.backend; }));
  // After capacity, where the shim has always printed it.
  const auto capacity = std::find_if(rows.begin(), rows.end(),
                                     [](const auto& row) { return row.spec.key == "capacity"; });
  rows.insert(capacity + 1, config::fraction_option<ShimConfig>(
                                "memory_fraction",
                                "the cap as a fraction of the device's memory (backend:host: of "
                                "`capacity`, which it then requires).",
                                [](auto& c) -> auto& { return c.memory_fraction; }));
  rows.push_back(config::retired_option<ShimConfig>("segments", kSegmentsRetired));
  return rows;
}

void finish(ShimConfig& c, const config::KeySet& given) {
  config::raise_to_granularity(c, given);
  if (c.backend == Backend::kHost && c.mode == Mode::kAsync) {
    throw InvalidArgument("SDALLOC_CONF: mode:async needs backend:cuda (it is cudaMallocAsync)");
  }
  if (c.backend == Backend::kHost && c.memory_fraction > 0.0 && c.capacity == 0) {
    throw InvalidArgument(
        "SDALLOC_CONF: memory_fraction with backend:host needs capacity (the host has no "
        "device memory size to take a fraction of)");
  }
  config::validate_pool_conf(kName, c);
}

}  // namespace

const config::OptionTable<ShimConfig>& shim_options() {
  static const config::OptionTable<ShimConfig> table(kName, shim_rows(), finish);
  return table;
}

ShimConfig parse_shim_config(std::string_view text) { return shim_options().parse(text); }

std::string format_shim_config(const ShimConfig& config) { return shim_options().format(config); }

}  // namespace sdalloc::torch_shim
