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

std::vector<Option<ShimConfig>> shim_rows() {
  std::vector<Option<ShimConfig>> rows = config::lift<ShimConfig>(config::pool_options(
      {config::kModePool, kModeAsync, config::kModeVmm, config::kModePlanned}));
  rows.insert(rows.begin(),
              config::enum_option<ShimConfig>(
                  "backend", "where the memory comes from.",
                  {{"cuda", static_cast<int>(Backend::kCuda), "device memory"},
                   {"host", static_cast<int>(Backend::kHost),
                    "host memory, for tests and CPU-only machines; every device index, -1 "
                    "included, gets a host pool"}},
                  [](auto& c) -> auto& { return c.backend; }));
  rows.insert(
      rows.begin() + 1,
      config::enum_option<ShimConfig>(
          "segments", "how the pool's segments are made (mode:pool and planned).",
          {{"whole", static_cast<int>(Segments::kWhole),
            "one range each from the backend: cudaMalloc (host: mmap)"},
           {"chunked", static_cast<int>(Segments::kChunked),
            "2 MiB chunks mapped into reserved address space (CUDA's virtual memory API; host: "
            "a memfd): the consolidated arena grows in place and a released segment's chunks "
            "go into the next one, as the pool does over host memory"}},
          [](auto& c) -> auto& { return c.segments; }));
  // After capacity, where the shim has always printed it.
  const auto capacity = std::find_if(rows.begin(), rows.end(),
                                     [](const auto& row) { return row.spec.key == "capacity"; });
  rows.insert(capacity + 1, config::fraction_option<ShimConfig>(
                                "memory_fraction",
                                "the cap as a fraction of the device's memory (backend:host: of "
                                "`capacity`, which it then requires).",
                                [](auto& c) -> auto& { return c.memory_fraction; }));
  return rows;
}

void finish(ShimConfig& c, const config::KeySet& given) {
  config::raise_to_granularity(c, given);
  if (c.backend == Backend::kHost && c.mode == Mode::kAsync) {
    throw InvalidArgument("SDALLOC_CONF: mode:async needs backend:cuda (it is cudaMallocAsync)");
  }
  if (c.segments == Segments::kChunked && (c.mode == Mode::kAsync || c.mode == Mode::kVmm)) {
    throw InvalidArgument(
        "SDALLOC_CONF: segments:chunked is for mode:pool and planned (mode:vmm maps its own "
        "pages; mode:async takes cudaMallocAsync's)");
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
